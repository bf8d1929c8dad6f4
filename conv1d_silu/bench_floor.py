"""The floor of a call's access pattern: the bench's ``bare`` rows (``python -m conv1d_silu.bench --floor``).

A bare launch is the routed program's own launch (its geometry, vector width, cp.async pipeline and
order of rows) with its kernel's BARE flag set: it keeps the program's loads of x (and dy) and its
stores of y (dx), and drops the math, the slab partials and the fold (the forward writes y = x, the
backward dx[t - (K-1)] = x[t] + dy[t]). Its time is what the program's bytes cost in the program's
own pattern; ours over it is what the math and the fold add, and it over ``copy_`` / ``add`` is
what the pattern costs against PyTorch's flat one. x without documents or states, as the bench's
rows: channel-last (S, C), or channel-first (B, C, L) (``--layout BCL``), whose bare backward is the
simple walk's staging, the loads of each slab's K-1 taps and the stores (dx = x + dy, the taps added
to each slab's first token; rows of whole slabs or one sequence).

Without the math a kernel needs fewer registers, so more of its CTAs would fit on an SM: a bare
launch gets the dynamic shared memory that holds it to the routed launch's CTAs per SM. For the
channel-last programs on the H100 (32 registers against 122-127 for the bf16 K = 4 backward
programs, 32 against 64 for the forward): left to run 6-7 CTAs per SM where the routed program runs
4 (one- and eight-slab backward programs), the bare launches measured up to 1.23x slower than the
routed ones; at equal occupancy they took 0.80-0.94x of its time. The shared memory that pins them
leaves them less L1 than the routed launch has (one-slab programs: 4 CTAs of ~46 KB against 4 of
36 KB per SM). The channel-first backward's bare form takes 56 registers against 64 (sm_90).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch

from . import gpu, gpu_bcl, ops, runtime
from .documents import doc_table
from .dtypes import accumulator_dtype
from .runtime import Launch

SMEM_STEP = 256  # bytes: the granularity of the shared memory that pins a bare launch's occupancy


def bare(launch: Launch) -> Launch:
    """``launch`` with its kernel's last template argument, BARE (default false), set."""
    return replace(launch, kernel=launch.kernel[:-1] + ", true>")


def held_to(bare_launch: Launch, routed: Launch, launcher: gpu.Launcher, device: torch.device) -> Launch:
    """``bare_launch`` with the least dynamic shared memory (in SMEM_STEP steps) that lets no more of
    its CTAs share an SM than of ``routed``'s."""
    want = launcher.max_active_blocks(routed, device)
    if launcher.max_active_blocks(bare_launch, device) <= want:
        return bare_launch
    optin = runtime.device_limits(runtime.device_index(device)).smem_optin
    lo, hi = bare_launch.smem, optin // SMEM_STEP * SMEM_STEP
    while hi - lo > SMEM_STEP:  # too many CTAs at lo, few enough at hi
        mid = (lo + hi) // 2 // SMEM_STEP * SMEM_STEP
        if launcher.max_active_blocks(replace(bare_launch, smem=mid), device) <= want:
            hi = mid
        else:
            lo = mid
    return replace(bare_launch, smem=hi)


class Floor(NamedTuple):
    fwd: Callable[[], None]  # submits the forward's bare launch, which writes y
    bwd: Callable[[], None]  # submits the backward's, which writes dx
    y: torch.Tensor
    dx: torch.Tensor


def calls(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dy: torch.Tensor,
          fwd_program: str | None = None, bwd_program: str | None = None) -> Floor:
    """The bare launches of the programs that a call on these tensors is routed to (the weight
    gradients in the weight's dtype; a program named for a direction is forced there), on fresh
    outputs, through the op's current launcher (``ops.use_launcher``)."""
    if x.dim() == 3 and x.stride(2) == 1:
        return _channel_first(x, weight, bias, dy, fwd_program, bwd_program)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"x: the floor takes channel-last (S, C) or channel-first (B, C, L) x, got shape {tuple(x.shape)} "
            f"strides {x.stride()}"
        )
    doc = doc_table(x, None, None, None)
    has_bias = bias is not None
    programs = [ops.choose(d, x, weight, has_bias, doc, False, p) for d, p in (("fwd", fwd_program), ("bwd", bwd_program))]
    for program in programs:
        if not (program.cuda and program.layout == "BLC"):
            raise ValueError(f"x: its {program.direction} program {program.name!r} has no bare launch")
    launcher, x_stride, device = ops.launcher(), x.stride(0), x.device
    fwd = gpu.forward_launch(
        x, weight, has_bias, doc, False, False, True, programs[0], x_stride, gpu.alignment(x), launcher
    )
    bwd, _, scratch = gpu.backward_launches(
        x, weight, has_bias, doc, False, True, weight.dtype, programs[1], x_stride, dy.stride(0),
        gpu.alignment(x, dy), 0, False, launcher,
    )
    fwd, bwd = (
        launcher.prepare(held_to(bare(launch), launch, launcher, device), device) for launch in (fwd, bwd)
    )
    y, dx = torch.empty_like(x), torch.empty_like(x)
    workspace, tickets = gpu.backward_scratch(*scratch, device, False)
    w, b = gpu.dense(weight), gpu.dense(bias)
    dw, db = torch.empty_like(w), None if b is None else torch.empty_like(b)
    fwd_tensors = (x, w, b, None, None, y, None)
    bwd_tensors = (x, dy, w, b, None, None, dx, None, dw, db, workspace, tickets, None, None)
    return Floor(lambda: fwd(fwd_tensors), lambda: bwd(bwd_tensors), y, dx)


def _channel_first(x, weight, bias, dy, fwd_program, bwd_program) -> Floor:
    """:func:`calls` for channel-first x and dy (B, C, L): the channel-first programs' bare launches."""
    if dy.shape != x.shape or dy.stride(2) != 1:
        raise ValueError(f"dy: expected x's shape {tuple(x.shape)} with the sequence contiguous, got "
                         f"{tuple(dy.shape)} strides {dy.stride()}")
    xv, dyv = x.transpose(1, 2), dy.transpose(1, 2)  # the op's (B, L, C) views
    B, L, C = xv.shape
    K, has_bias = weight.shape[1], bias is not None
    doc = doc_table(xv, None, None, None)
    chosen = {}
    for d, p in (("fwd", fwd_program), ("bwd", bwd_program)):
        chosen[d] = program = ops.choose(d, xv, weight, has_bias, doc, False, p)
        if not (program.cuda and program.layout == "BCL"):
            raise ValueError(f"program: {program.name!r} is no channel-first {d} program: it has no bare launch here")
        if program.chain:
            raise ValueError(f"program: {program.name!r} (a chained round) has no bare launch")
    if not gpu_bcl.simple_walk(doc.mode, False, B, L):
        raise ValueError(f"x: {B} rows of {L} tokens take the document walk, which has no bare launch")
    y, dx = gpu_bcl.like_x(xv), gpu_bcl.like_x(xv)
    n_docs, has_table = doc.num_docs or 0, doc.table is not None
    fwd = gpu_bcl.forward_launch(
        x.dtype, weight.dtype, K, B, C, L, (*gpu_bcl.strides(xv), *gpu_bcl.strides(y)), gpu.alignment(xv, y),
        has_bias, doc.mode, False, False, True, n_docs, has_table,
    )
    bwd, _, ws_elems = gpu_bcl.backward_launches(
        x.dtype, weight.dtype, weight.dtype, K, B, C, L,
        (*gpu_bcl.strides(xv), *gpu_bcl.strides(dyv), *gpu_bcl.strides(dx)), gpu.alignment(xv, dyv, dx), has_bias,
        doc.mode, False, True, n_docs, has_table, False,
    )
    launcher, device = ops.launcher(), x.device
    fwd, bwd = (
        launcher.prepare(held_to(bare(launch), launch, launcher, device), device) for launch in (fwd, bwd)
    )
    workspace, _ = gpu.backward_scratch(ws_elems, accumulator_dtype(x.dtype), 0, device, False)
    w, b = gpu.dense(weight), gpu.dense(bias)
    dw, db = torch.empty_like(w), None if b is None else torch.empty_like(b)
    fwd_tensors = (xv, w, b, doc.table, None, y, None)
    bwd_tensors = (xv, dyv, w, b, doc.table, None, dx, None, dw, db, workspace)
    return Floor(lambda: fwd(fwd_tensors), lambda: bwd(bwd_tensors), y.transpose(1, 2), dx.transpose(1, 2))
