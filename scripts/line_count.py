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
ITEMSIZE = 2  # bf16
PERIOD = 8  # rows after which the line pattern of a contiguous bf16 row repeats (8 x 2C = 0 mod 128)


def _requests(threads: int, width: int, address) -> int:
    """Requests of ``threads`` threads in warps over PERIOD steps: per warp and step, the 128-byte
    lines that the ``width``-byte accesses at ``address(thread, step)`` (None: idle) touch. The rows
    of different lanes are far apart, so lines never merge across rows."""
    total = 0
    for w0 in range(0, threads, WARP):
        for j in range(PERIOD):
            at = [a for a in (address(t, j) for t in range(w0, min(w0 + WARP, threads))) if a is not None]
            total += len({a // LINE for a in at} | {(a + width - 1) // LINE for a in at})
    return total


def backward_requests(program: routes.Program, S: int, C: int) -> float:
    """L2 requests per tensor row of x (dy and dx alike) for the backward ``program``."""
    plan = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, C, S, C, C, 16, True, 0,
                             False, True, program, 0)
    vec = gpu.vector_width(ITEMSIZE, 4, C, 16, (C, C), bwd=True, max_bytes=program.vec_bytes)
    n_vec, lane_rows, tile_v = C // vec, program.slabs_per_lane * gpu.SLAB, plan.tile_v
    # one period of units: flat units cycle through the nodes every n_vec / gcd(n_vec, tile_v) units
    units = n_vec // math.gcd(n_vec, tile_v) if plan.n_vec else plan.n_ctiles

    def address(unit: int, t: int, j: int) -> int | None:
        lane, vl = divmod(t, tile_v)
        node, v = divmod(unit * tile_v + vl, n_vec) if plan.n_vec else (0, unit * tile_v + vl)
        if v >= n_vec:
            return None
        return (((node * program.cta_lanes + lane) * lane_rows + j) * C + v * vec) * ITEMSIZE

    requests = sum(_requests(plan.block, vec * ITEMSIZE, lambda t, j, u=u: address(u, t, j)) for u in range(units))
    nodes = units * tile_v // n_vec if plan.n_vec else 1
    return requests / (nodes * program.cta_lanes * PERIOD)


def forward_requests(program: routes.Program, S: int, C: int) -> float:
    """L2 requests per tensor row of x (y alike) for the forward ``program``."""
    plan = gpu.forward_plan(torch.bfloat16, torch.bfloat16, 4, C, S, C, 16, True, 0, False, False, True,
                            program, 0)
    vec = gpu.vector_width(ITEMSIZE, 4, C, 16, (C,), bwd=False, max_bytes=program.vec_bytes)
    n_vec, tile_v = C // vec, plan.tile_v
    items = math.lcm(plan.block, tile_v)  # one period of (lane, vector) items: whole blocks and whole lanes

    def address(ct: int, item: int, i: int) -> int | None:
        lane, vl = divmod(item, tile_v)
        v = ct * tile_v + vl
        return ((lane * program.rows_per_lane + i) * C + v * vec) * ITEMSIZE if v < n_vec else None

    # warps are cut from each block's threads (a block need not be a whole number of warps)
    requests = sum(_requests(plan.block, vec * ITEMSIZE, lambda t, i, c=ct, b=b0: address(c, b + t, i))
                   for ct in range(plan.n_ctiles) for b0 in range(0, items, plan.block))
    return requests / (items // tile_v * PERIOD)


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
            ideal = math.ceil(ITEMSIZE * C / LINE)
            print(f"{name} {C} {got:.3f} {ideal} {got / ideal:.3f} {got / (ITEMSIZE * C) / (4 / 512):.3f}")


if __name__ == "__main__":
    main()
