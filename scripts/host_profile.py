"""Where the host time of one eager forward + backward goes (cProfile), at a tiny size where the
GPU is idle; prints the per-call CPU time next to PyTorch's (x * 2).sum().backward()."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import causal_conv1d_silu  # noqa: E402


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(64, 64, device=dev, requires_grad=True)
    w = torch.randn(64, 4, device=dev, requires_grad=True)
    b = torch.randn(64, device=dev, requires_grad=True)

    def ours():
        causal_conv1d_silu(x, w, b).sum().backward()

    def theirs():
        (x * 2).sum().backward()

    for fn in (theirs, ours):
        for _ in range(30):
            fn()
        torch.cuda.synchronize() if dev == "cuda" else None
        t0 = time.process_time()
        for _ in range(300):
            fn()
        print(f"{fn.__name__}: {(time.process_time() - t0) / 300 * 1e6:.1f} us CPU per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        ours()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    print(out.getvalue())


if __name__ == "__main__":
    main()
