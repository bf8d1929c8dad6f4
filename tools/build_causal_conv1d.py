"""Builds causal-conv1d in place for this machine's GPU alone, for the bench's peer rows
(``--baselines cc1d``) on a GPU machine:

    python3 tools/build_causal_conv1d.py SRC [--arch sm_90] [--jobs 4] [--all-dtypes]

SRC is causal-conv1d's source tree (its sdist, ``CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE pip download
--no-deps --no-build-isolation --no-binary :all: causal-conv1d==1.7.0`` from an environment with torch,
unpacked; or a clone); nothing of it is part of this repository. Its setup.py compiles every
kernel for every architecture its CUDA knows (with one architecture patched in by hand, 286 s on an
H100 machine). Here it compiles for one architecture and, unless ``--all-dtypes``, only the bf16 and
fp32 kernels (fp16 leaves its dispatch and its explicit instantiations): the kernels the bench times
are the same instances, compiled by the same flags. The extension is built in place and stripped of
its debug sections; afterwards ``PYTHONPATH=SRC`` imports it. A tree whose extension imports from
SRC is left as it is. Where the patch meets a setup.py or dispatch it does not know, it stops and
says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

GENCODE = re.compile(r'^([ \t]*)cc_flag\.append\("-gencode"\)\n\1cc_flag\.append\("arch=compute_\w+,code=sm_\w+"\)\n', re.M)
CC_FLAG = re.compile(r"^([ \t]*)cc_flag = \[\]\n", re.M)
OURS = re.compile(r'cc_flag \+= \["-gencode", "arch=compute_\w+,code=sm_\w+"\]')
HALF_INSTANCE = re.compile(r"^template void [^\n]*at::Half[^\n]*\n", re.M)
# a dispatch macro's fp16 branch: `if (T == at::ScalarType::Half) { using t = at::Half; __VA_ARGS__(); } else if`
HALF_BRANCH = re.compile(
    r"if \((\w+) == at::ScalarType::Half\) \{[ \t]*\\\n[ \t]*using (\w+) = at::Half;[ \t]*\\\n"
    r"[ \t]*__VA_ARGS__\(\);[ \t]*\\\n[ \t]*\} else if"
)


def one_arch(setup_py: str, arch: str) -> str:
    """setup.py with its -gencode pairs made ``pass`` (every block stays valid Python, version checks
    included) and one target, ``arch`` (``sm_90``), added where cc_flag starts empty; a setup.py
    patched before gets the new target in place of its own."""
    number = arch.removeprefix("sm_")
    ours = f'cc_flag += ["-gencode", "arch=compute_{number},code=sm_{number}"]'
    if OURS.search(setup_py):
        return OURS.sub(ours, setup_py)
    if len(CC_FLAG.findall(setup_py)) != 1:
        raise RuntimeError("setup.py: not one `cc_flag = []` (its layout changed; build it by hand)")
    out, pairs = GENCODE.subn(lambda m: f"{m.group(1)}pass\n", setup_py)
    if not pairs:
        raise RuntimeError("setup.py: no cc_flag -gencode pairs found (its layout changed; build it by hand)")
    return CC_FLAG.sub(lambda m: f"{m.group(0)}{m.group(1)}{ours}\n", out, count=1)


def without_fp16(source: str) -> str:
    """A .cu or .cpp file of causal-conv1d without its fp16 instantiations and dispatch branches."""
    return HALF_BRANCH.sub("if", HALF_INSTANCE.sub("", source))


def patch(src: Path, arch: str, all_dtypes: bool) -> None:
    setup = src / "setup.py"
    setup.write_text(one_arch(setup.read_text(), arch))
    if all_dtypes:
        return
    files = sorted((src / "csrc").glob("*.cu")) + sorted((src / "csrc").glob("*.cpp"))
    for f in files:
        f.write_text(without_fp16(f.read_text()))
    left = [f.name for f in files if HALF_INSTANCE.search(f.read_text())]
    dispatch = "".join(f.read_text() for f in files if f.suffix == ".cpp")
    if left or re.search(r"using \w+ = at::Half;", dispatch) or "at::BFloat16" not in dispatch:
        raise RuntimeError(f"fp16 left in {left or 'the dispatch'} (causal-conv1d's layout changed; use --all-dtypes)")


def imports(src: Path) -> str | None:
    """None where causal-conv1d's extension imports from ``src``, else why not."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    probe = "import torch, causal_conv1d, causal_conv1d_cuda; print(causal_conv1d_cuda.__file__)"
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if run.returncode:
        return run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit status {run.returncode}"
    found = Path(run.stdout.strip()).resolve()
    return None if found.parent == src else f"causal_conv1d_cuda comes from {found}, not from {src}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="causal-conv1d's source tree (setup.py, csrc/)")
    p.add_argument("--arch", default=None, help="sm_XY (default: the current GPU's)")
    p.add_argument("--jobs", type=int, default=4, help="parallel compiles (MAX_JOBS; it has four files)")
    p.add_argument("--all-dtypes", action="store_true", help="keep the fp16 kernels too")
    args = p.parse_args(argv)
    src = args.src.resolve()
    if not (src / "setup.py").is_file():
        raise SystemExit(f"{src}: no setup.py (causal-conv1d's source tree: its sdist or a clone)")
    if imports(src) is None:
        print(f"causal-conv1d already built: PYTHONPATH={src}")
        return 0
    arch = args.arch
    if arch is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    patch(src, arch, args.all_dtypes)
    env = {**os.environ, "CAUSAL_CONV1D_FORCE_BUILD": "TRUE", "MAX_JOBS": str(args.jobs)}
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src, env=env, check=True)
    strip = shutil.which("strip")
    for so in src.glob("causal_conv1d_cuda*.so"):
        if strip:
            subprocess.run([strip, "--strip-debug", str(so)], check=True)
        print(f"{so.name}: {so.stat().st_size / 2**20:.1f} MiB")
    if (why := imports(src)) is not None:
        raise RuntimeError(f"built, but not importable with PYTHONPATH={src}: {why}")
    print(f"causal-conv1d built for {arch}: PYTHONPATH={src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
