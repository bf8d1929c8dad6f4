"""Where the host time of one eager forward + backward goes (cProfile), at a tiny size where the
GPU is idle; prints the per-call CPU time next to PyTorch's (x * 2).sum().backward().

    python3 tools/host_profile.py [--noop] [--calls N]

Without a GPU (or with --noop) the kernels' launches go to a launcher that validates and packs
them but launches nothing, on CPU tensors routed as on sm_90: the whole host path but the driver
call, on any machine; a second measurement stops where the launcher is entered.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops, runtime  # noqa: E402
from conv1d_silu.bench import host_overhead_us, tiny_steps  # noqa: E402


LIMITS = runtime.DeviceLimits(sm_count=132, max_threads=1024, smem_default=48 * 1024, smem_optin=227 * 1024)


def _no_launch(*args) -> int:
    return 0


# The driver's calls as stand-ins of one call each: C builtins for the context and stream queries
# (CuPy's and torch's bindings are C calls too; both return 0, the context "loaded" and the stream),
# a Python function that returns at once for the launch itself.
NO_DRIVER = runtime.Driver(int, abs, _no_launch, _no_launch, lambda index: contextlib.nullcontext())


class NoLaunch(gpu.Launcher):
    """Prepares every planned launch as ``runtime.prepare`` does (its geometry checked against an
    H100's limits: 132 SMs, two CTAs per SM) and calls it as the GPU path does (overlap check,
    this thread's struct, the addresses, the context and stream queries, the programmatic switch),
    with :data:`NO_DRIVER` in place of the driver: the whole host path but the compiled kernel's
    lookup and the driver's calls, on any machine. ``checks=False`` returns at once: the path up to
    the launcher."""

    def __init__(self, checks: bool = True):
        self.checks = checks
        self.ready: dict[int, tuple] = {}  # id of a planned launch -> (it, its prepared form), as runtime.launch keeps them

    def sm_count(self, device) -> int:
        return LIMITS.sm_count

    def max_active_blocks(self, launch, device) -> int:
        return 2

    def prepare(self, launch, device):
        if not self.checks:
            return _no_launch
        return runtime.Prepared(launch, LIMITS, 0, 1, 0, True, NO_DRIVER)

    def __call__(self, launch, device) -> None:
        """A bound launch (the channel-first and decoding paths): its planned launch prepared once."""
        planned = launch.planned or launch
        kept = self.ready.get(id(planned))
        if kept is None:
            kept = self.ready[id(planned)] = (planned, self.prepare(planned, device))
        kept[1](launch.tensors, launch.outputs, launch.inputs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--noop", action="store_true", help="no-op launcher on CPU tensors even with a GPU")
    p.add_argument("--calls", type=int, default=300, help="forward + backward calls timed, and again profiled")
    args = p.parse_args(argv)
    if args.noop or not torch.cuda.is_available():
        cpu = torch.device("cpu")
        with ops.use_launcher(NoLaunch(), emulate_arch="sm_90"):
            times = host_overhead_us(cpu, iters=args.calls)
        with ops.use_launcher(NoLaunch(checks=False), emulate_arch="sm_90"):
            bare = host_overhead_us(cpu, iters=args.calls)
        report(times, bare)
        with ops.use_launcher(NoLaunch(), emulate_arch="sm_90"):
            profile(cpu, args.calls)
    else:
        report(host_overhead_us(torch.device("cuda"), iters=args.calls))
        profile(torch.device("cuda"), args.calls)


def report(times: dict[str, float], bare: dict[str, float] | None = None) -> None:
    print(f"theirs: {times['torch_x2_sum_backward']:.1f} us CPU per call")
    print(f"ours: {times['conv1d_silu_fwd_bwd']:.1f} us CPU per call (ratio {times['ratio']:.2f})")
    if bare is not None:  # measured apart, each against PyTorch's line of its own rounds
        ours, theirs = bare["conv1d_silu_fwd_bwd"], bare["torch_x2_sum_backward"]
        print(f"ours up to the launcher (returning at once): {ours:.1f} us CPU per call "
              f"(ratio {bare['ratio']:.2f}; theirs {theirs:.1f})")


def profile(device: torch.device, calls: int) -> None:
    ours = tiny_steps(device)["conv1d_silu_fwd_bwd"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        ours()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    print(out.getvalue())


if __name__ == "__main__":
    main()
