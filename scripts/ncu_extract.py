"""Chosen counters of each kernel in an Nsight Compute raw CSV (`ncu --csv --page raw`, or the
raw.csv that scripts/ncu-profile writes): one line per kernel.

    python3 scripts/ncu_extract.py raw.csv [metric ...]     (default: DRAM bytes, L2 sectors, instructions)
"""

from __future__ import annotations

import csv
import sys

DEFAULT = [
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_sector_op_read_hit_rate.pct", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.per_cycle_active", "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
]


def main(path: str, metrics: list[str]) -> None:
    with open(path) as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("=="))]
    header, data = rows[0], rows[2:]  # the second row holds the units
    present = [m for m in metrics if m in header]
    if len(present) < len(metrics):
        print("not in this export:", [m for m in metrics if m not in header])
    for row in data:
        name = row[header.index("Kernel Name")].split("(")[0]
        print(name, " ".join(f"{m}={row[header.index(m)]}" for m in present))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or DEFAULT)
