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
import subprocess
import sys
import tempfile
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

        from conv1d_silu import gpu, ops
        from conv1d_silu.bench import host_overhead_us

        cuda = torch.cuda.is_available() and not args.noop
        with contextlib.ExitStack() as stack:
            if not cuda:
                stack.enter_context(base_ops.use_launcher(no_launch(base_gpu), emulate_arch="sm_90"))
                stack.enter_context(ops.use_launcher(no_launch(gpu), emulate_arch="sm_90"))
            # the revision's op is one more "peer" of the bench's host line: same steps, same rounds
            med = host_overhead_us(
                torch.device("cuda" if cuda else "cpu"), iters=args.rounds * args.calls, rounds=args.rounds,
                peers={"base": conv1d_silu_base.causal_conv1d_silu},
            )
    if "base_fwd_bwd" not in med:
        sys.exit(f"the op at {args.rev} failed (above)")
    theirs, new, base = med["torch_x2_sum_backward"], med["conv1d_silu_fwd_bwd"], med["base_fwd_bwd"]
    print(f"{'cuda' if cuda else 'no-op launcher, cpu'}: CPU µs per call, median of {args.rounds} rounds")
    for name, t in (("torch (x * 2).sum().backward()", theirs), (f"ours at {args.rev}", base), ("ours, working tree", new)):
        print(f"  {name:32s} {t:7.1f}")
    print(f"  working tree / {args.rev}: {new / base:.3f}; against PyTorch's line {base / theirs:.2f}x -> {new / theirs:.2f}x")


if __name__ == "__main__":
    main()
