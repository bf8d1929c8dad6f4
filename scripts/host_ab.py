"""Host cost of one tiny eager forward + backward: the working tree against an earlier revision, in
one process, rounds alternating (a slow or shared CPU's drift hits both sides alike; separate
processes on a virtual machine differ by 10-30 % from run to run, more than a host change gains).

The revision's package is exported next to the tree as ``conv1d_silu_base`` with its custom-op
namespace renamed, so both register side by side. On a GPU both launch their kernels; without one
(or with --noop) launches go to a launcher that does nothing, on CPU tensors routed as on sm_90.

    python3 scripts/host_ab.py --rev HEAD~1 [--rounds 60] [--noop]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def export_base(rev: str, into: Path) -> None:
    """``conv1d_silu`` of ``rev`` as the package ``conv1d_silu_base`` under ``into``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "conv1d_silu"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    pkg = into / "conv1d_silu"
    for path in pkg.glob("*.py"):  # the package imports itself relatively; only the op names clash
        text = path.read_text()
        text = re.sub(r"\bconv1d_silu::", "conv1d_silu_base::", text)
        path.write_text(text.replace("torch.ops.conv1d_silu.", "torch.ops.conv1d_silu_base."))
    pkg.rename(into / "conv1d_silu_base")


def no_launch(gpu):
    """A launcher of ``gpu`` (a conv1d_silu package's gpu module) that plans and packs but returns
    where the driver would be entered: the whole host path but the launch, on any machine."""

    class NoLaunch(gpu.Launcher):
        def sm_count(self, device) -> int:
            return 132

        def max_active_blocks(self, launch, device) -> int:
            return 2

        def __call__(self, launch, device) -> None:
            pass

    return NoLaunch()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="HEAD", help="the revision to compare the working tree with")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=300, help="calls per round and side")
    p.add_argument("--noop", action="store_true", help="no-op launcher on CPU tensors even with a GPU")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export_base(args.rev, Path(tmp))
        sys.path.insert(0, tmp)
        import conv1d_silu_base
        from conv1d_silu_base import gpu as base_gpu
        from conv1d_silu_base import ops as base_ops

        import conv1d_silu
        from conv1d_silu import gpu, ops

        cuda = torch.cuda.is_available() and not args.noop
        dev = torch.device("cuda" if cuda else "cpu")
        x = torch.randn(64, 64, device=dev, requires_grad=True)
        w = torch.randn(64, 4, device=dev, requires_grad=True)
        b = torch.randn(64, device=dev, requires_grad=True)
        steps = {
            "torch (x * 2).sum().backward()": lambda: (x * 2).sum().backward(),
            f"ours at {args.rev}": lambda: conv1d_silu_base.causal_conv1d_silu(x, w, b).sum().backward(),
            "ours, working tree": lambda: conv1d_silu.causal_conv1d_silu(x, w, b).sum().backward(),
        }
        with contextlib.ExitStack() as stack:
            if not cuda:
                stack.enter_context(base_ops.use_launcher(no_launch(base_gpu), emulate_arch="sm_90"))
                stack.enter_context(ops.use_launcher(no_launch(gpu), emulate_arch="sm_90"))
            times = {name: [] for name in steps}
            for fn in steps.values():
                for _ in range(100):
                    fn()
            for _ in range(args.rounds):
                for name, fn in steps.items():
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.process_time()
                    for _ in range(args.calls):
                        fn()
                    times[name].append((time.process_time() - t0) / args.calls * 1e6)
    med = {name: statistics.median(t) for name, t in times.items()}
    theirs, base, new = med.values()
    print(f"{'cuda' if cuda else 'no-op launcher, cpu'}: CPU µs per call, median of {args.rounds} rounds")
    for name, t in times.items():
        print(f"  {name:32s} {med[name]:7.1f}  (min {min(t):.1f})")
    print(f"  working tree / {args.rev}: {new / base:.3f}; against PyTorch's line {base / theirs:.2f}x -> {new / theirs:.2f}x")


if __name__ == "__main__":
    main()
