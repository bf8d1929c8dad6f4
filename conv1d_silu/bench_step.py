"""A training step's host cost: ``python -m conv1d_silu.bench --step``.

A small Mamba-style block (a Linear in-projection into :class:`CausalConv1dSiLU`) runs forward +
backward eagerly and under ``torch.compile`` (default mode, and ``mode="reduce-overhead"``, which
replays the step as CUDA graphs). At ``SHAPE`` the GPU's kernels take a few µs each, so the step is
bound by the host: the wall time per step (steps back to back, one synchronize after them) is what
a training loop waits for, the process CPU time per step is where it goes. The modes take turns
within every round, so a drift of the machine reaches each alike. Before timing, each compiled
step's output and gradients are compared bitwise with eager's on the same inputs.
Without a GPU: eager only (``reduce-overhead`` records CUDA graphs).
"""

from __future__ import annotations

import statistics
import time

import torch

from .module import CausalConv1dSiLU

MODES = ("eager", "compile", "reduce-overhead")
SHAPE = (2, 512, 256)  # (batch, tokens, channels)


class Block(torch.nn.Module):
    """A Mamba-style block's in-projection and short convolution."""

    def __init__(self, C: int, K: int, device, dtype):
        super().__init__()
        self.proj = torch.nn.Linear(C, C, device=device, dtype=dtype)
        self.conv = CausalConv1dSiLU(C, K, device=device, dtype=dtype)

    def forward(self, x):
        return self.conv(self.proj(x))


def _train_step(model, x, dy) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.backward(dy)
    return y


def _same_bits(step, eager, x, dy) -> bool:
    got, want = _train_step(step, x, dy).detach().clone(), _train_step(eager, x, dy)
    grads = zip(step.parameters(), eager.parameters())
    return torch.equal(got, want) and all(torch.equal(a.grad, b.grad) for a, b in grads)


def run(device: torch.device, modes=None, K: int = 4, dtype: torch.dtype = torch.bfloat16, shape=SHAPE,
        rounds: int = 7, steps: int = 50, warmup: int = 5) -> list[dict]:
    """One row per mode: ``wall_us`` and ``cpu_us`` per training step (medians over ``rounds`` of
    ``steps``), and ``same_bits`` (the step's output and gradients equal eager's)."""
    cuda = device.type == "cuda"
    modes = modes or (MODES if cuda else ("eager",))
    B, L, C = shape
    torch.manual_seed(C * 31 + K)
    eager = Block(C, K, device, dtype)
    x = torch.randn(B, L, C, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    models = {}
    for mode in modes:
        model = Block(C, K, device, dtype)
        model.load_state_dict(eager.state_dict())
        models[mode] = model if mode == "eager" else torch.compile(model, mode=None if mode == "compile" else mode)
    rows = {}
    for mode, model in models.items():
        for _ in range(warmup):  # compiles, records the graphs
            _train_step(model, x, dy)
        rows[mode] = dict(mode=mode, B=B, L=L, C=C, K=K, dtype=str(dtype).replace("torch.", ""),
                          same_bits=_same_bits(model, eager, x, dy), wall=[], cpu=[])
    for _ in range(rounds):
        for mode, model in models.items():
            if cuda:
                torch.cuda.synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                _train_step(model, x, dy)
            if cuda:
                torch.cuda.synchronize()
            rows[mode]["wall"].append((time.perf_counter() - wall) / steps * 1e6)
            rows[mode]["cpu"].append((time.process_time() - cpu) / steps * 1e6)
    return [dict({k: v for k, v in r.items() if k not in ("wall", "cpu")},
                 wall_us=statistics.median(r["wall"]), cpu_us=statistics.median(r["cpu"])) for r in rows.values()]


def markdown(rows: list[dict], device_name: str) -> str:
    r0 = rows[0]
    lines = [
        f"Training step of a Linear + CausalConv1dSiLU block on {device_name}, x ({r0['B']}, {r0['L']}, {r0['C']}) "
        f"{r0['dtype']}, K = {r0['K']}: µs per forward + backward", "",
        "| mode | wall µs | CPU µs | bits equal to eager |", "|---|---|---|---|",
    ]
    lines += [f"| {r['mode']} | {r['wall_us']:.1f} | {r['cpu_us']:.1f} | {'yes' if r['same_bits'] else 'NO'} |"
              for r in rows]
    return "\n".join(lines)
