"""Registers and loop sizes of the hot backward instances, from SASS, without a GPU.

    python scripts/sass_loops.py [--source FILE] [--arch sm_90]

Compiles the bf16, K = 4, 8-byte backward instances (bias on / off, 1, 2 or 8 slabs per lane,
tiled / flat) with nvcc (the CUDA 13.0 toolkit, the same compiler generation as the H200 machine's
NVRTC), disassembles them with cuobjdump (PATH, or the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels) and prints each instance's registers, instruction count and every
loop of more than 40 instructions (a
backward branch and its target). The walk over the rows is the second-largest loop; the climb is
the last large one. --source takes a whole expanded kernel text (e.g. another commit's, as
docs/performance.md v20 makes it) to compare with.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import kernels  # noqa: E402
from conv1d_silu.documents import SINGLE  # noqa: E402
from conv1d_silu.gpu import pipe_depth  # noqa: E402

bf16 = torch.bfloat16
INSTANCES = {
    f"bias{int(bias)} spl{spl} flat{int(flat)}": kernels.name_expression(
        "conv1d_silu_bwd", bf16, bf16, bf16, 4, 4, bias, SINGLE, False, True, "int", spl, pipe_depth(4), flat)
    for spl in (1, 2, 8) for bias in (False, True) for flat in (False, True)
}


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        from nvidia import cu13  # the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels

        bin_dir = Path(cu13.__path__[0]) / "bin"
    except ImportError:
        bin_dir = None
    if bin_dir is None or not (bin_dir / "cuobjdump").exists() or not (bin_dir / "nvdisasm").exists():
        sys.exit("needs cuobjdump and nvdisasm (PATH, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    # cuobjdump -sass runs nvdisasm, which the wheel puts beside it but not on PATH
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return str(bin_dir / "cuobjdump")


def compile_sass(source: str, arch: str) -> tuple[str, str]:
    """(ptxas -v log, SASS) of the INSTANCES compiled from `source` with nvcc."""
    with tempfile.TemporaryDirectory() as d:
        cu, cubin = Path(d, "k.cu"), Path(d, "k.cubin")
        cu.write_text(kernels.with_instances(source, list(INSTANCES.values())))
        build = subprocess.run(["nvcc", "-std=c++17", "-ftz=true", f"-arch={arch}", "-cubin", "-Xptxas", "-v",
                                str(cu), "-o", str(cubin)], capture_output=True, text=True, check=False)
        if build.returncode:
            sys.exit(build.stderr[-4000:])
        sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return build.stderr, sass


def loops(function: str) -> tuple[int, list[tuple[int, int, int]]]:
    """Instruction count and (start, end, instructions) of every loop of more than 40 instructions."""
    code = [(int(a, 16), i) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", function)]
    found = []
    for at, ins in code:
        m = re.search(r"\bBRA\s+(?:\S+,\s*)?0x([0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < at:
            start = int(m.group(1), 16)
            n = sum(1 for a, _ in code if start <= a <= at)
            if n > 40:
                found.append((start, at, n))
    return len(code), sorted(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, help="an expanded backward kernel text (default: this tree's)")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    source = args.source.read_text() if args.source else kernels.source("conv1d_silu_bwd")
    log, sass = compile_sass(source, args.arch)
    regs = dict(zip(re.findall(r"Compiling entry function '(\S+)'", log), map(int, re.findall(r"Used (\d+) registers", log))))
    functions = {f.split("\n", 1)[0].strip(): f for f in re.split(r"\n\s*Function : ", sass)[1:]}
    mangled = {e: next(m for m in regs if _matches(m, e)) for e in INSTANCES.values()}
    for label, expr in INSTANCES.items():
        name = mangled[expr]
        total, found = loops(functions[name])
        print(f"{label}: {regs[name]} registers, {total} instructions; loops: "
              + ", ".join(f"{s:#x}-{e:#x} {n}" for s, e, n in found))


def _matches(mangled: str, expr: str) -> bool:
    # the mangled name's template flags: ...Lb<bias>ELi<mode>ELb<init>ELb<silu>EiLi<spl>ELi<depth>ELb<flat>E
    args = [a.strip() for a in expr[expr.index("<") + 1:-1].split(",")]
    bias, mode, init, silu, spl, depth, flat = (args[i] for i in (5, 6, 7, 8, 10, 11, 12))
    b = {"true": "1", "false": "0"}
    tail = f"ELb{b[bias]}ELi{mode}ELb{b[init]}ELb{b[silu]}EiLi{spl}ELi{depth}ELb{b[flat]}E"
    return tail in mangled


if __name__ == "__main__":
    main()
