"""Runs one backward program against `rowgroup` (bits of dx, dweight, dbias) at a few shapes and
prints its instantiation's registers, local memory, shared memory and resident CTAs per SM. One
program per process: a faulting program takes only its own process down.

    python3 scripts/program_check.py PROGRAM [S:C ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import gpu, ops, runtime  # noqa: E402
from conv1d_silu.tune import _call, _setup  # noqa: E402


def main(program: str, shapes: list[str]) -> None:
    dev = torch.device("cuda")
    for shape in shapes or ["4096:384", "262144:384", "1000:264"]:
        S, C = (int(v) for v in shape.split(":"))
        x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, dev)
        ref = _call("bwd_bias", "rowgroup", x, dy, w, b, doc, gd)
        got, launch = _with_launch(lambda: _call("bwd_bias", program, x, dy, w, b, doc, gd))
        same = [torch.equal(a, c) for a, c in zip(got[:3], ref[:3])]
        index = torch.cuda.current_device()
        fn = runtime.function(launch.source, launch.kernel, index)
        per_sm = runtime.max_active_blocks(launch.source, launch.kernel, launch.block, launch.smem, index)
        print(program, shape, "bits equal" if all(same) else f"BITS DIFFER {same}",
              f"{fn.num_regs} registers, {fn.local_size_bytes} B local, {launch.block} threads, "
              f"{launch.smem} B shared, {per_sm} CTAs per SM: {launch.kernel}", flush=True)


def _with_launch(call) -> tuple[object, runtime.Launch]:
    """``call()``'s result and the last launch it made (recorded on its way to the GPU)."""
    seen = []

    class Recorder(gpu.Launcher):
        def __call__(self, launch, device):
            seen.append(launch)
            super().__call__(launch, device)

    with ops.use_launcher(Recorder()):
        result = call()
    return result, seen[-1]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
