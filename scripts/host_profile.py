"""Where the host time of one eager forward + backward goes (cProfile), at a tiny size where the
GPU is idle; prints the per-call CPU time next to PyTorch's (x * 2).sum().backward().

Without a GPU (or with --noop) the kernels' launches go to a launcher that does nothing, on CPU
tensors routed as on sm_90: the whole host path but the driver call, on any machine.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host_ab import no_launch  # noqa: E402

from conv1d_silu import gpu, ops  # noqa: E402
from conv1d_silu.bench import host_overhead_us, tiny_steps  # noqa: E402


def main() -> None:
    if "--noop" in sys.argv or not torch.cuda.is_available():
        with ops.use_launcher(no_launch(gpu), emulate_arch="sm_90"):
            profile(torch.device("cpu"))
    else:
        profile(torch.device("cuda"))


def profile(device: torch.device) -> None:
    times = host_overhead_us(device)
    print(f"theirs: {times['torch_x2_sum_backward']:.1f} us CPU per call")
    print(f"ours: {times['conv1d_silu_fwd_bwd']:.1f} us CPU per call (ratio {times['ratio']:.2f})")
    ours = tiny_steps(device)["conv1d_silu_fwd_bwd"]
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
