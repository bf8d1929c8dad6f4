"""Registers, spills and the SASS instruction mix of kernel instances, compiled on the CPU with
NVRTC and the runtime's options: evidence for a kernel change before a GPU run.

    python3 tools/kernel_stats.py [--arch sm_90] 'conv1d_silu_bwd_bcl<c1s::bf16, ...>' ...

The channel-first backward's walk is straight-line code, so its static instruction count tracks
the dynamic one (2376 static against 2335 issued per warp and round under ncu on the H100). The
instruction mix needs cuobjdump (the nvidia-cuda-cuobjdump wheel, or CUDA's own; CUOBJDUMP names
it); without it the tool reports registers and spills only.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import kernels  # noqa: E402
from conv1d_silu.runtime import NVRTC_OPTIONS  # noqa: E402

CUPY_OPTIONS = ("--device-as-default-execution-space", "-ftz=true")  # what CuPy's RawModule adds
SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def source_of(expr: str) -> str:
    """The kernel source that defines the instance ``expr``."""
    name = expr.split("<")[0]
    return "conv1d_silu_bwd" if name == "conv1d_silu_fold" else (
        "conv1d_silu_bcl" if name.endswith("_bcl") else name
    )


def compile_nvrtc(source: str, exprs: list[str], arch: str, extra: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """The compiler log and the cubin of ``exprs``, instances of ``source``, as the runtime compiles
    them; RuntimeError where NVRTC rejects them or leaves one uninstantiated."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(kernels.source(source).encode(), f"{source}.cu".encode(), 0, [], [])
    for e in exprs:
        nvrtc.nvrtcAddNameExpression(prog, e.encode())
    opts = [o.encode() for o in (*NVRTC_OPTIONS, *CUPY_OPTIONS, f"-arch={arch}", *extra)]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    try:
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{source} for {arch}:\n{log.decode(errors='replace')}")
        for e in exprs:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, e.encode())
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not lowered:
                raise RuntimeError(f"{source} for {arch}: {e} was not instantiated")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        if not size:
            raise RuntimeError(f"{source} for {arch}: an empty cubin")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return log.decode(errors="replace"), cubin


def stats(expr: str, arch: str = "sm_90", cuobjdump: str | None = None) -> dict:
    """registers, spill stores / loads (bytes) and, with cuobjdump, the instruction count by opcode."""
    log, cubin = compile_nvrtc(source_of(expr), [expr], arch, ("--ptxas-options=-v",))
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", log)]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    spilled = max((int(stores) + int(loads) for stores, loads in spills), default=0)
    out = {"registers": max(regs), "spill_bytes": spilled, "ops": None}
    if cuobjdump:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
            sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True)
        out["ops"] = collections.Counter(m.group(1) for m in map(SASS_LINE.match, sass.stdout.splitlines()) if m)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("instances", nargs="+", help="name expressions, as kernels.name_expression writes them")
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args(argv)
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    for expr in args.instances:
        s = stats(expr, args.arch, cuobjdump)
        line = f"{expr}: {s['registers']} registers, {s['spill_bytes']} bytes spilled"
        if s["ops"] is not None:
            top = ", ".join(f"{op} {n}" for op, n in s["ops"].most_common(12))
            line += f", {sum(s['ops'].values())} instructions ({top})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
