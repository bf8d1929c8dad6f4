"""The decoding step's benchmark: ``python -m conv1d_silu.bench --decode``.

One new token per sequence (``causal_conv1d_update``'s common call: x ``(B, C)``, a ``(B, C, W)``
state without circular buffer) at each batch size: the GPU time per step of the decoding kernel
and of the plain-PyTorch step (conv1d_silu.decoding, the CPU path), each from a CUDA graph of
``STEPS`` steps replayed (median over the reps; the state stays in L2 between steps as it does in a
decoding loop), and the host time of one eager call (process CPU time, the GPU never the limit at
these sizes). Without a GPU: the CPU step's wall time per call.
"""

from __future__ import annotations

import statistics
import time

import torch

from .compat import causal_conv1d_update
from .decoding import update as plain_update

BATCHES = (1, 64, 256)
STEPS = 50  # steps per captured graph


def _gpu_us(step, reps: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(STEPS):
            step()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / STEPS)
    return statistics.median(times)


def _host_us(step, calls: int, cuda: bool) -> float:
    for _ in range(20):
        step()
    if cuda:
        torch.cuda.synchronize()
    clock = time.process_time if cuda else time.perf_counter
    t0 = clock()
    for _ in range(calls):
        step()
    spent = clock() - t0
    if cuda:
        torch.cuda.synchronize()
    return spent / calls * 1e6


def run(device: torch.device, C: int = 5120, K: int = 4, state_len: int | None = None,
        dtype: torch.dtype = torch.bfloat16, batches=BATCHES, reps: int = 20, calls: int = 1000) -> list[dict]:
    """One row per batch size: µs per step (``kernel_gpu_us`` / ``plain_gpu_us`` on a GPU) and
    ``host_us`` per eager call of ``causal_conv1d_update``."""
    cuda = device.type == "cuda"
    state_len = state_len or K
    g = torch.Generator(device=device).manual_seed(C * 31 + K)
    w = torch.randn(C, K, device=device, dtype=dtype, generator=g)
    b = torch.randn(C, device=device, dtype=dtype, generator=g)
    rows = []
    for B in batches:
        x = torch.randn(B, C, device=device, dtype=dtype, generator=g)
        state = torch.randn(B, C, state_len, device=device, dtype=dtype, generator=g)

        def ours():
            causal_conv1d_update(x, state, w, b, "silu")

        def plain():
            plain_update(x.unsqueeze(-1), state, w, b, True, None, None)

        row = dict(B=B, C=C, K=K, state_len=state_len, dtype=str(dtype).replace("torch.", ""),
                   host_us=_host_us(ours, calls, cuda))
        if cuda:
            row.update(kernel_gpu_us=_gpu_us(ours, reps), plain_gpu_us=_gpu_us(plain, reps))
        rows.append(row)
    return rows


def markdown(rows: list[dict], device_name: str) -> str:
    head = f"Decoding step on {device_name}: µs per step, one new token per sequence"
    if "kernel_gpu_us" not in rows[0]:
        lines = [head + " (CPU step, wall time)", "", "| B | C | K | µs |", "|---|---|---|---|"]
        lines += [f"| {r['B']} | {r['C']} | {r['K']} | {r['host_us']:.1f} |" for r in rows]
        return "\n".join(lines)
    lines = [
        head + " (GPU time from graph replays; host time per eager call)", "",
        "| B | C | K | state | kernel GPU | plain-PyTorch step GPU | host |", "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['B']} | {r['C']} | {r['K']} | {r['state_len']} | {r['kernel_gpu_us']:.2f} | {r['plain_gpu_us']:.2f} | "
        f"{r['host_us']:.1f} |"
        for r in rows
    ]
    return "\n".join(lines)
