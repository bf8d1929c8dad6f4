"""The memory and instruction counters of each kernel in an Nsight Compute raw CSV export
(scripts/ncu-profile writes raw.csv): DRAM bytes, L2 sectors, executed instructions, occupancy.

    python3 scripts/ncu_extract.py raw.csv
"""
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
want = ["Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
        "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum",
        "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum", "lts__t_sector_op_read_hit_rate.pct",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
        "smsp__inst_executed.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
        "dram__sectors_read.sum", "dram__sectors_write.sum", "lts__d_sectors_fill_sysmem.sum", "lts__t_sectors_lookup_miss.sum"]
idx = {w: hdr.index(w) for w in want if w in hdr}
print("missing:", [w for w in want if w not in hdr])
for r in rows[2:]:
    print({w: r[i] for w, i in idx.items()})
