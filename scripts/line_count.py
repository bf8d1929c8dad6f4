"""L2 requests per byte of a program's row stream, from its geometry alone (no GPU).

    python3 scripts/line_count.py [--S 1048576] [--C 256 264 272 320] [--programs NAME ...]

Each warp access of x, dy, dx (backward) or x, y (forward) is one L2 request per 128-byte line it
touches (docs/performance.md v24: Nsight Compute's lts__t_requests counted 4.00 sectors per request
at C = 256 and 2.67 at 264, and the bare pattern's time followed the requests). For every warp
of one period of units this walks the rows of one turn period (8 rows: a row of C bf16 channels
shifts the line boundaries by 2C mod 128 bytes per row, and every lane starts on a multiple of 8
rows), collects the lines its active threads touch per row, and prints requests per row of the
tensor against the ideal (a whole-line read of the row) and against C = 256's 4 per 512 bytes.
Halo rows (K-1 per lane) and window_before are left out: they add about the same share at any C.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, routes  # noqa: E402

LINE = 128
WARP = 32
PERIOD = 8  # rows after which the line pattern of a contiguous bf16 row repeats (8 x 2C = 0 mod 128)


def _lines(addresses: list[int], width: int) -> int:
    """128-byte lines that accesses of ``width`` bytes at ``addresses`` touch."""
    return len({a // LINE for a in addresses} | {(a + width - 1) // LINE for a in addresses})


def backward_requests(program: routes.Program, S: int, C: int, itemsize: int = 2) -> float:
    """L2 requests per tensor row of x (dy and dx alike) for the backward ``program``."""
    plan = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, C, S, C, C, 16, True, 0,
                             False, True, program, 0)
    vec = gpu.vector_width(itemsize, 4, C, 16, (C, C), bwd=True, max_bytes=program.vec_bytes)
    n_vec = C // vec
    lane_rows = program.slabs_per_lane * gpu.SLAB
    # one period of units: flat units cycle through nodes with n_vec / gcd(n_vec, tile_v) nodes per period
    units = (n_vec // math.gcd(n_vec, plan.tile_v)) if plan.n_vec else plan.n_ctiles
    nodes = (units * plan.tile_v // n_vec) if plan.n_vec else 1
    requests = 0
    for unit in range(units):
        for w0 in range(0, plan.block, WARP):
            for j in range(PERIOD):
                addrs = []
                for tid in range(w0, min(w0 + WARP, plan.block)):
                    lane, vl = divmod(tid, plan.tile_v)
                    if plan.n_vec:
                        node, v = divmod(unit * plan.tile_v + vl, n_vec)
                    else:
                        node, v = 0, unit * plan.tile_v + vl
                    if v >= n_vec:
                        continue
                    row = (node * routes.LANES + lane) * lane_rows + j
                    addrs.append((row * C + v * vec) * itemsize)
                # rows of different lanes / nodes are far apart: lines never merge across rows
                requests += _lines(addrs, vec * itemsize)
    rows = nodes * routes.LANES * PERIOD
    return requests / rows


def forward_requests(program: routes.Program, S: int, C: int, itemsize: int = 2) -> float:
    """L2 requests per tensor row of x (y alike) for the forward ``program``."""
    plan = gpu.forward_plan(torch.bfloat16, torch.bfloat16, 4, C, S, C, 16, True, 0, False, False, True,
                            program, 0)
    vec = gpu.vector_width(itemsize, 4, C, 16, (C,), bwd=False, max_bytes=program.vec_bytes)
    n_vec, rows_per_lane = C // vec, program.rows_per_lane
    # one period: lcm of the block and the row's vectors in (lane, vector) items
    items = math.lcm(plan.block, plan.tile_v)
    requests = 0
    for ct in range(plan.n_ctiles):
        for item0 in range(0, items, WARP):
            for i in range(PERIOD):
                addrs = []
                for item in range(item0, item0 + WARP):
                    lane, vl = divmod(item, plan.tile_v)
                    v = ct * plan.tile_v + vl
                    if v < n_vec:
                        addrs.append(((lane * rows_per_lane + i) * C + v * vec) * itemsize)
                requests += _lines(addrs, vec * itemsize)
    return requests / (items // plan.tile_v * PERIOD)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--S", type=int, default=1048576)
    ap.add_argument("--C", type=int, nargs="+", default=[256, 264, 272, 320, 384, 392])
    ap.add_argument("--programs", nargs="+", default=["rowgroup_8b", "rowgroup_long_8b", "rowgroup_long_flat32_8b",
                                                      "fwd_flat16_8b", "fwd_rows16_8b"])
    args = ap.parse_args()
    print("program C requests/row whole-line/row vs-ideal vs-C256-per-byte")
    for name in args.programs:
        program = routes.PROGRAMS[name]
        count = forward_requests if program.direction == "fwd" else backward_requests
        for C in args.C:
            got = count(program, args.S, C)
            ideal = math.ceil(2 * C / LINE)
            print(f"{name} {C} {got:.3f} {ideal} {got / ideal:.3f} {got / (2 * C) / (4 / 512):.3f}")


if __name__ == "__main__":
    main()
