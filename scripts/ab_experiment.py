"""A/B experiments in one process: backward / forward graph-replay times (cold L2, medians) of
kernel-source variants (text patches of conv1d_silu_bwd.cu, see VARIANTS), channel-tile sizes and
program fields (BWD / FWD names like "fwd_rows16_8b@rows_per_lane=8,max_tile_vectors=16"),
bf16, K = 4, bias, against PyTorch's add / copy of the same shape; CTAS pins the resident
CTA count of the backward, CARVEOUT its shared-memory / L1 split.

    python3 scripts/ab_experiment.py S:C ...
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, kernels, ops, routes, runtime  # noqa: E402
from conv1d_silu.bench import Timer  # noqa: E402
from conv1d_silu.tune import _setup  # noqa: E402

_source = kernels.source.__wrapped__

NO_CHAIN = ("      if (!__syncthreads_or(fold)) break;",
            "      if (!__syncthreads_or(fold) || level >= 0) break;  // timing only: nobody folds")
# Timing only: every CTA writes its node and stops, no ticket and no fold above the CTA (what the
# fold launch leaves in the backward; since v32 the backward runs so wherever gpu.split_fold holds,
# so this and the other ticket variants change only the trees the tickets still climb).
NO_TICKET = ("    for (int level = CTA_LEVEL; level < climb_to; ++level, shift += 3) {",
             "    for (int level = CTA_LEVEL; level < climb_to && level < 0; ++level, shift += 3) {")
# Timing only: the climb stops at level 2, so nothing above it is folded (the most a one-CTA fold of
# every level above 2 could save).
NO_TOP = (NO_TICKET[0], "    for (int level = CTA_LEVEL; level < climb_to && level < 2; ++level, shift += 3) {")
# Occupancy: the backward uses 121 registers (ptxas -v, sm_90), so 128-thread CTAs fit 4 per SM and
# 256-thread ones 2. lb128x5 caps it at 96 registers (108 bytes of spills) for 5 CTAs per SM, lb256x3 at
# 80 (608 bytes). Each only for programs of at most that many threads (BWD="rowgroup_8b ..." for lb128x5):
# a bigger CTA fails to launch.
_ENTRY = "__global__ void __launch_bounds__(256) conv1d_silu_bwd("
LB128X5 = (_ENTRY, "__global__ void __launch_bounds__(128, 5) conv1d_silu_bwd(")
LB256X3 = (_ENTRY, "__global__ void __launch_bounds__(256, 3) conv1d_silu_bwd(")
LB256X2 = (_ENTRY, "__global__ void __launch_bounds__(256, 2) conv1d_silu_bwd(")
# The 16-byte backward takes 237-241 registers (one 256-thread CTA, 8 warps per SM); capped for three
# 128-thread CTAs (12 warps) it gets 168 with ~100 bytes of spills (nvcc 13.0; docs/performance.md
# v33): BWD="rowgroup_long@max_tile_vectors=16 rowgroup_long_flat32@max_tile_vectors=16".
LB128X3 = (_ENTRY, "__global__ void __launch_bounds__(128, 3) conv1d_silu_bwd(")
# A register cap without a CTA count: 112 registers fit the one-slab backward without spills (ptxas -v),
# and 18 warps per SM: 6 CTAs of 3 warps or 3 of 6 where 128 registers fit 5 or 2.
MAXNREG112 = (_ENTRY, "__global__ void __maxnreg__(112) conv1d_silu_bwd(")
# The access pattern's own floor: the same loads and stores with (almost) no math. The backward
# stores dx = g[t] (g = dy * 1 + x), the forward y = x; the bits differ from every real program.
NO_MATH_BWD = [
    ("g[e] = dv[e] * silu_grad(z, sigmoid(z));", "g[e] = dv[e] + xv[e];"),
    ("acc[k][e] = fma_(g[e], xr[(P + 1 + k) % K][e], acc[k][e]);", "(void)0;"),
    ("v = fma_(wv[K - 1 - m][e], gr[(P + 1 + m) % K][e], v);", "if (m == K - 1) v = gr[(P + 1 + m) % K][e];"),
]
NO_MATH_FWD = [("conv1d_silu_fwd", "yv[e] = SILU ? z * sigmoid(z) : z;", "yv[e] = xv[e];")]
# Timing only (wrong bits): a lane reads no rows past its own (the K-1 tail tokens of x and dy, which
# the next lane reads as its first rows) / no rows of x before them (window_before's direct loads):
# what the halo costs (docs/performance.md v14).
NO_TAIL = [("      constexpr int N_STEPS = (int)LANE_ROWS + K - 1;", "      constexpr int N_STEPS = (int)LANE_ROWS;")]
# Timing only (wrong dweight): the CTA writes no lane partials and folds none (v14 "Next" 3).
NO_CTA_FOLD = [
    ("    if (c0 < C && (SPL == 1 || r0 >= S)) {", "    if (c0 < C && (SPL == 1 || r0 >= S) && n_units < 0) {"),
    ("    for (int i = threadIdx.x; i < n_vals; i += blockDim.x) {",
     "    for (int i = threadIdx.x; i < n_vals && n_units < 0; i += blockDim.x) {"),
]
# Timing only (no ordering: a parent may be folded before its children's nodes are visible): what
# the ticket's release, which waits for the CTA's outstanding writes (dx included), costs.
RELAXED_TICKET = [("atom.add.acq_rel.gpu.u32", "atom.add.relaxed.gpu.u32")]
NO_BEFORE = [("      window_before<0, K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, r0, pos0, docs.state, n_docs, xr);",
              "      for (int m = 0; m < K; ++m)\n        for (int e = 0; e < VEC; ++e) xr[m][e] = A(0);")]
# Diagnostic for the flat backward (exact only where every unit's columns share one node, i.e. the
# vectors per row are a multiple of the columns per CTA, e.g. C = 256): thread 0 takes column 0's
# ticket for all columns, one atomic per CTA and level as in the tiled programs, instead of one per
# column (docs/performance.md v20).
FLAT_ONE_TICKET = [
    ("      if (threadIdx.x < (FLAT ? tile_v : 1)) {", "      if (threadIdx.x == 0) {"),
    ("        col_n[g] = fold;\n",
     "        for (int q = 0; q < (FLAT ? tile_v : 1); ++q) {\n"
     "          col_n[q] = fold;\n"
     "          col_src[q] = col_src[0] + q * VEC;\n"
     "          col_dst[q] = col_dst[0] + q * VEC;\n"
     "        }\n"),
]
# Timing only: dx written with rows padded to 64 channels (every row of dx starts on a 128-byte
# line; the host side hands the kernel a padded buffer, see _PaddedDx). With ROW_PAD=64 for x and
# dy as well, no row of any tensor is cut mid-line: is the ragged-C cost in the dx writes?
DX_RS = "((C + 63) / 64 * 64)"
DX_PAD = [
    ("      T* pdx = dx + (I)r0 * (I)C + c0;", f"      T* pdx = dx + (I)r0 * (I){DX_RS} + c0;"),
    ("          pdx += C;", f"          pdx += {DX_RS};"),
]


class _PaddedDx:
    """gpu's torch, except that the backward's dx (the one empty tensor of x's 2-D shape it asks
    for) is a view of a buffer whose rows are padded to 64 channels (variant dx_pad)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        shape = args[0] if args else None
        if isinstance(shape, torch.Size) and len(shape) == 2 and shape[1] % 64:
            S, C = shape
            return torch.empty(S, -(-C // 64) * 64, **kwargs)[:, :C]
        return torch.empty(*args, **kwargs)


# Timing only (wrong bits; S a multiple of 2048, K = 4, eight-slab programs): lanes walk adjacent
# slabs wave after wave (lane l takes slabs l, l + 8, l + 16, ... of its node), so a CTA's 8 lanes read
# 256 consecutive rows at a time, as the one-slab programs' and the forward's CTAs do, where normally
# they are 256 rows apart. v12 measured it at C = 384 only (no change); ragged C is v22 Next 2.
FOOTPRINT = [
    ("    const long long r0 = (node * CTA_LANES + lane) * LANE_ROWS;",
     "    const long long r0 = node * CTA_LANES * LANE_ROWS + lane * SLAB;"),
    ("      auto prefetch_whole = [&](int st) {", "      int fp_turns = 0;\n      auto prefetch_whole = [&](int st) {"),
    ("        async_commit();\n      };\n      auto prefetch = [&](int q) {",
     "        if (++fp_turns % (SLAB / K) == 0) {\n          px += (LANES - 1) * SLAB * x_rs;\n"
     "          pdy += (LANES - 1) * SLAB * dy_rs;\n        }\n        async_commit();\n      };\n"
     "      auto prefetch = [&](int q) {"),
    ("          store_vec(pdx, 0, dxv);\n          pdx += C;\n",
     "          store_vec(pdx, 0, dxv);\n          pdx += C;\n"
     "          if (ju % SLAB == SLAB - 1) pdx += (LANES - 1) * SLAB * C;\n"),
]
# The lane's window (the K-1 rows of x before r0, loaded synchronously by window_before) is read
# after the pipeline's first DEPTH-1 turns are requested, so at a one-wave start it waits for the end
# of the start-up burst (docs/performance.md v35: 15 % of the stall samples at 32768 x 264). Its
# lines asked for first (prefetch into L1 or L2). Moving window_before itself ahead of the turns does
# not do it: nvcc then unpacks the window before the turns' copies, which wait a DRAM round trip.
_PREFETCH_TURNS = "#pragma unroll\n      for (int q = 0; q < DEPTH - 1; ++q) prefetch(q);\n"


def _window_hint(level: str) -> list:
    hint = ("#pragma unroll\n      for (int m = 0; m < K - 1; ++m)\n"
            "        if (r0 - (K - 1) + m >= 0)\n"
            f"          asm volatile(\"prefetch.global.{level} [%0];\" ::\"l\"(x + (I)(r0 - (K - 1) + m) * (I)x_rs + c0));\n")
    return [(_PREFETCH_TURNS, hint + _PREFETCH_TURNS)]


# Timing only: every CTA returns at once.
EMPTY_CTAS = ("  for (long long unit = blockIdx.x; unit < n_units; unit += gridDim.x) {",
              "  for (long long unit = blockIdx.x; unit < n_units && n_units < 0; unit += gridDim.x) {")
# The fold kernel as before v41: one pass, cold, after its griddepcontrol.wait (the kernel's pass 0,
# every global access off before the wait, skipped; an extra __syncthreads stays)
FOLD_COLD = [("for (int pass = 0; pass < 2; ++pass)", "for (int pass = 1; pass < 2; ++pass)")]
# A patch is (old, new) for the backward source or (source, old, new).
VARIANTS = {
    "base": [], "no_chain": [NO_CHAIN], "no_ticket": [NO_TICKET],
    "lb128x5": [LB128X5], "lb256x3": [LB256X3], "lb256x2": [LB256X2], "lb128x3": [LB128X3],
    "maxnreg112": [MAXNREG112],
    "no_math": NO_MATH_BWD + NO_MATH_FWD,
    "no_top": [NO_TOP], "memset_tickets": [],
    # The backward is near issue-bound and short of warps at once (docs/performance.md v10): a deeper
    # row pipeline alone, and with the arithmetic gone, show what is left when both limits give way.
    "deep": [], "no_math_deep": NO_MATH_BWD + NO_MATH_FWD,
    # Half the rows in flight: does the L1 beside the shared memory (CARVEOUT) cap the row pipeline?
    "shallow": [],
    "no_math_no_ticket": NO_MATH_BWD + [NO_TICKET],  # the pattern without the tree above the CTA
    "no_tail": NO_TAIL, "no_before": NO_BEFORE, "no_halo": NO_TAIL + NO_BEFORE,
    "no_math_no_ticket_no_halo": NO_MATH_BWD + [NO_TICKET] + NO_TAIL + NO_BEFORE,
    "no_math_no_ticket_no_fold": NO_MATH_BWD + [NO_TICKET] + NO_CTA_FOLD,
    "no_math_no_ticket_no_fold_no_before": NO_MATH_BWD + [NO_TICKET] + NO_CTA_FOLD + NO_BEFORE,
    "no_fold": [NO_TICKET] + NO_CTA_FOLD, "no_cta_fold": NO_CTA_FOLD, "relaxed_ticket": RELAXED_TICKET,
    "flat_one_ticket": FLAT_ONE_TICKET, "dx_pad": DX_PAD, "node_pad": [],
    "footprint": FOOTPRINT,
    "window_l1": _window_hint("L1"), "window_l2": _window_hint("L2"),
    # the tree above the CTAs climbed by tickets at every size, where gpu.split_fold would launch
    # conv1d_silu_fold (docs/performance.md v32)
    "tickets": [],
    # Timing only (no dweight / dbias above the CTAs' nodes): no fold launch and no ticket climb, the
    # most any way of folding the tree above the CTAs could save (docs/performance.md v35)
    "no_tree": [NO_TICKET],
    "no_math_no_ticket_no_fold_footprint": NO_MATH_BWD + [NO_TICKET] + NO_CTA_FOLD + FOOTPRINT,
    # Timing only, the short backward's time taken apart (docs/performance.md v40): without the
    # tree above the CTAs and the CTA's own fold; the bare pattern (no math, no folds); the bare
    # pattern without the halo rows; CTAs that return at once (what the launch alone costs). Those
    # in NO_FOLD_LAUNCH also turn the fold launch off.
    "no_tree_no_cta_fold": [NO_TICKET] + NO_CTA_FOLD,
    "bare": NO_MATH_BWD + [NO_TICKET] + NO_CTA_FOLD,
    "bare_no_halo": NO_MATH_BWD + [NO_TICKET] + NO_CTA_FOLD + NO_TAIL + NO_BEFORE,
    "empty": [EMPTY_CTAS],
    "fold_only": [EMPTY_CTAS],  # the same, with the fold launch (folding whatever the workspace holds)
    "fold_plain": [],  # the fold kernel launched without the programmatic attribute
    "fold_cold": FOLD_COLD,
    # The fold kernel's first level in one batch of loads up to 128 parents (8 per thread; 98 registers
    # with fp32 nodes, fp64 ones spill): at 262144 tokens its two batches took 5.4-5.9 µs (H100, v40).
    "fold_batch8": [("FOLD_BATCH = 4;", "FOLD_BATCH = 8;")],
}
# Variants run without the fold launch (gpu.FOLD_MAX_NODES = 0): the tickets climb, or nothing folds.
NO_FOLD_LAUNCH = {"tickets", "no_tree", "no_tree_no_cta_fold", "bare", "bare_no_halo", "empty"}
DEEP_ROWS = 16  # gpu.PREFETCH_ROWS of the *deep variants (8 otherwise)
SHALLOW_ROWS = 4  # ... and of "shallow"
_prefetch_rows = gpu.PREFETCH_ROWS
_fold_max_nodes = gpu.FOLD_MAX_NODES
_take = gpu._TicketReserve.take
_programmatic = runtime.programmatic_launches


def _no_reserve(self, n: int) -> None:
    """memset_tickets: a captured backward zeroes tickets of its own (a memset node per replay), as
    before the reserve of gpu._TicketReserve."""
    return None


def use_variant(name: str) -> None:
    """Patch the kernel text (a VARIANTS name), or "file=PATH": the backward's whole expanded source
    from PATH (an older version against the current one in the same process)."""
    def patched(src: str) -> str:
        if name.startswith("file="):
            return Path(name[5:]).read_text() if src == "conv1d_silu_bwd" else _source(src)
        text = _source(src)
        for patch in VARIANTS[name]:
            target, old, new = patch if len(patch) == 3 else ("conv1d_silu_bwd", *patch)
            if src == target:
                assert old in text, (name, old[:60])
                text = text.replace(old, new)
        return text

    kernels.source = patched
    gpu.torch = _PaddedDx() if name == "dx_pad" else torch
    gpu._TicketReserve.take = _no_reserve if name == "memset_tickets" else _take
    gpu.PREFETCH_ROWS = DEEP_ROWS if name.endswith("deep") else SHALLOW_ROWS if name == "shallow" else _prefetch_rows
    gpu.FOLD_MAX_NODES = 0 if name in NO_FOLD_LAUNCH else _fold_max_nodes
    runtime.programmatic_launches = (lambda index: False) if name == "fold_plain" else _programmatic
    global _node_pad
    _node_pad = name == "node_pad"
    _plan.cache_clear()
    gpu.forward_plan.cache_clear()
    runtime._functions.clear()
    runtime._smem_ready.clear()


def register_program(spec: str) -> None:
    """A program name with fields, "fwd_rows16_8b@rows_per_lane=8,max_tile_vectors=16": that program
    with those integer fields changed, added to routes.PROGRAMS under the whole name."""
    if "@" in spec and spec not in routes.PROGRAMS:
        base, fields = spec.split("@")
        kw = {k: int(v) for k, v in (f.split("=") for f in fields.split(","))}
        routes.PROGRAMS[spec] = dataclasses.replace(routes.PROGRAMS[base], name=spec, **kw)


def _name(base: str, tiles: int, align: int) -> str:
    return f"{base}_t{tiles}" + (f"_a{align}" if align else "")


SM_SMEM = 233472  # bytes of shared memory per SM on sm_90 (228 KiB); each CTA reserves 1 KiB more
_plan = gpu.backward_plan
_node_pad = False


def _node_padded(*args) -> gpu.Plan:
    """Variant node_pad (flat programs; timing only, same bits): every node's columns padded to a
    multiple of the CTA's columns, the pad columns idle (the kernel treats channels >= C as absent),
    so no CTA, and no warp, spans two nodes: does the straddle make ragged C slow?"""
    plan = _plan(*args)
    if not plan.n_vec:
        return plan
    S, program = args[5], args[13]
    cta_nodes = gpu.tree_shape(S)[1][program.cta_level]
    n_vec = -(-plan.n_vec // plan.tile_v) * plan.tile_v
    # the plan's tickets are (parents above the CTA's level) x n_vec: scale, don't recount
    return dataclasses.replace(plan, n_vec=n_vec, n_units=cta_nodes * n_vec // plan.tile_v,
                               n_tickets=plan.n_tickets // plan.n_vec * n_vec)


def pin_ctas(ctas: int) -> None:
    """CTAS="4 5": the backward's dynamic shared memory padded so that at most that many CTAs fit
    per SM (0: the kernel's own count). The padding takes the L1 with it (the carveout grows to hold
    it; docs/performance.md v14), so CARVEOUT is the cleaner way to change the count."""
    base = _node_padded if _node_pad else _plan

    def padded(*args):
        plan = base(*args)
        return dataclasses.replace(plan, smem=max(plan.smem, SM_SMEM // ctas - 1024))

    gpu.backward_plan = padded if ctas else base
    runtime._smem_ready.clear()


_prepare = runtime._prepare_smem


def set_carveout(percent: int) -> None:
    """CARVEOUT="-1 58 72": the kernels' preferred shared-memory carveout in percent of the SM's
    228 KiB (-1: the driver's choice), i.e. how the SM's 256 KiB splits into shared memory and L1,
    and so how many CTAs fit: does the L1 left beside the shared memory move the time?"""
    def prepare(fn, smem: int, index: int) -> None:
        _prepare(fn, smem, index)
        fn.preferred_shared_memory_carveout = percent

    runtime._prepare_smem = prepare


def main(shapes: list[str]) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, reps=int(os.environ.get("REPS", "25")), warmup=2, graph=True)
    med = lambda f: round(statistics.median(timer(f)), 2)  # noqa: E731
    tiles = [int(t) for t in os.environ.get("TILES", "0").split()]  # channel vectors per tile; 0: the program's own
    # ALIGNS="0 32 128": also channel tiles that start on multiples of that many bytes (Program.tile_align_bytes)
    aligns = [int(a) for a in os.environ.get("ALIGNS", "0").split()]
    tile_keys = [(tv, al) for tv in tiles for al in aligns]
    variants = os.environ.get("VARIANTS", "base").split()
    cta_counts = [int(n) for n in os.environ.get("CTAS", "0").split()]
    carveouts = [int(n) for n in os.environ.get("CARVEOUT", "-1").split()]
    bwd_progs = os.environ.get("BWD", "rowgroup_8b rowgroup_long_8b").split()
    fwd_progs = os.environ.get("FWD", "fwd_rows_8b fwd_rows16_8b").split()
    # ROW_PAD="0 64": also read x and dy as column slices of buffers whose rows are padded to a multiple
    # of that many channels (row starts aligned to 128 bytes for bf16 at 64): does the row alignment,
    # not the width, make C = 264 / 392 / 408 slow? (dx and y stay contiguous.)
    pads = [int(p) for p in os.environ.get("ROW_PAD", "0").split()]
    for spec in bwd_progs + fwd_progs:
        register_program(spec)
    for shape, pad in [(s, p) for s in shapes for p in pads]:
        S, C = (int(v) for v in shape.split(":"))
        x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
        if pad:
            width = -(-C // pad) * pad
            x, dy = (torch.zeros(S, width, device=dev, dtype=t.dtype)[:, :C].copy_(t) for t in (x, dy))
        out = torch.empty(S, C, device=dev, dtype=x.dtype)
        row = {"S": S, "C": C, "row_pad": pad, "add": med(lambda: torch.add(x, dy, out=out)),
               "copy": med(lambda: out.copy_(x))}
        for tv, al in tile_keys:
            for base in bwd_progs + fwd_progs:
                own = routes.PROGRAMS[base].max_tile_vectors
                routes.PROGRAMS[_name(base, tv, al)] = dataclasses.replace(
                    routes.PROGRAMS[base], name=_name(base, tv, al), max_tile_vectors=tv or own,
                    tile_align_bytes=al or routes.PROGRAMS[base].tile_align_bytes)
        ref = None
        for v in variants:
            use_variant(v)
            cases = [(p, k, n, co) for p in bwd_progs for k in tile_keys for n in cta_counts for co in carveouts]
            for base, (tv, al), ctas, co in cases:
                name = _name(base, tv, al)
                pin_ctas(ctas)
                set_carveout(co)
                call = lambda: ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, name)  # noqa: E731
                key = f"{v}/{name}" + (f"/cta{ctas}" if ctas else "") + (f"/co{co}" if co >= 0 else "")
                try:
                    got = call()
                except Exception as err:  # e.g. a CTA larger than the variant's launch bounds
                    row[key] = f"FAILED {type(err).__name__}: {str(err)[:120]}"
                    continue
                if ref is None:
                    ref = got
                same = all(torch.equal(a, c) for a, c in zip(got[:3], ref[:3]))
                row[key] = med(call) if same else f"BITS DIFFER {med(call)}"
            pin_ctas(0)
            set_carveout(-1)
            for base, (tv, al), co in [(p, k, co) for p in fwd_progs for k in tile_keys for co in carveouts]:
                name = _name(base, tv, al)
                set_carveout(co)
                row[f"{v}/{name}" + (f"/co{co}" if co >= 0 else "")] = med(
                    lambda: ops.forward_impl(x, w, b, doc, None, False, True, name))
            set_carveout(-1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
