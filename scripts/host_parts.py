"""Host cost of one tiny eager call, piece by piece, on a CUDA GPU: PyTorch's
(x * 2).sum().backward(), the autograd.Function floor (three grad-requiring leaves, with no launch and
with two launches through runtime.launch), our whole call, and its parts (checks, forward_impl,
backward_impl, one launch, validate, torch.empty). Best of 5 timeit rounds, printed twice, µs.

    python3 scripts/host_parts.py          (docs/performance.md, host overhead)
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops, runtime, validation  # noqa: E402
from conv1d_silu.api import causal_conv1d_silu  # noqa: E402


class Capture(gpu.Launcher):
    """Keeps the launch instead of running it."""

    def __call__(self, launch, device) -> None:
        self.last = launch


def timed(name: str, fn, n: int = 3000) -> None:
    fn()
    torch.cuda.synchronize()
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    torch.cuda.synchronize()
    print(f"{name:30s} {best:7.2f} us", flush=True)


def main() -> None:
    dev = torch.device("cuda")
    x = torch.randn(64, 64, requires_grad=True, device=dev)
    w = torch.randn(64, 4, requires_grad=True, device=dev)
    b = torch.randn(64, requires_grad=True, device=dev)
    dy = torch.randn(64, 64, device=dev)
    w2, silu, doc = validation.check_inputs(x, w, b, None, None, None, False, "silu", None, None)
    capture = Capture()
    with ops.use_launcher(capture):
        ops.forward_impl(x, w2, b, doc, None, False, True, None)
    spec = capture.last  # a real forward launch, replayed by the floors below

    def floor(launches: bool):
        class Floor(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                ctx.save_for_backward(x, w, b)
                if launches:
                    runtime.launch(spec, dev)
                return torch.empty_like(x)

            @staticmethod
            def backward(ctx, dy):
                x, w, b = ctx.saved_tensors
                if launches:
                    runtime.launch(spec, dev)
                return torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)

        return lambda: Floor.apply(x, w, b).sum().backward()

    limits = runtime.device_limits(dev.index or 0)
    for _ in range(2):
        timed("theirs", lambda: (x * 2).sum().backward())
        timed("floor, no launch", floor(False))
        timed("floor + 2 launches", floor(True))
        timed("ours", lambda: causal_conv1d_silu(x, w, b).sum().backward())
        timed("ours, forward without grad", lambda: causal_conv1d_silu(x.detach(), w.detach(), b.detach()))
        timed("check_inputs", lambda: validation.check_inputs(x, w, b, None, None, None, False, "silu", None, None))
        timed("forward_impl", lambda: ops.forward_impl(x, w2, b, doc, None, False, True, None))
        timed("backward_impl", lambda: ops.backward_impl(dy, x, w2, b, doc, None, None, True, torch.float32, None))
        timed("runtime.launch (forward)", lambda: runtime.launch(spec, dev))
        timed("runtime.validate", lambda: runtime.validate(spec, limits))
        timed("torch.empty", lambda: torch.empty((64, 64), device=dev))


if __name__ == "__main__":
    main()
