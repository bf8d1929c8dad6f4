"""tools/gpu-check's shell logic, with a recording stand-in for python3 and nvidia-smi (the
stages themselves run on the GPU machine)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, stages: str, **env: str) -> list[str]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    for tool in ("python3", "nvidia-smi"):
        stub = bin_dir / tool
        stub.write_text(f'#!/usr/bin/env bash\necho "{tool} $*" >> "{log}"\n')
        stub.chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
            "CUPY_CACHE_DIR": str(tmp_path / "no-cache"), **env}
    subprocess.run(["bash", str(ROOT / "tools" / "gpu-check"), *stages.split()], env=full, check=True,
                   capture_output=True, timeout=60)
    return [line.split(" --json ")[1] for line in log.read_text().splitlines() if "conv1d_silu.tune --variants" in line]


def test_tune_parts_take_per_variant_arguments_and_a_second_pass(tmp_path):
    calls = _run(tmp_path, "tune-parts", TUNE_VARIANTS="bwd fwd", TUNE_ARGS="--S 2048",
                 TUNE_ARGS_fwd="--S 2048 32768", TUNE_MORE="--S 65536 --programs fwd_rows rowgroup")
    out = tmp_path / "out"
    assert calls == [
        f"{out}/tune-bwd.json --S 2048",
        f"{out}/tune-bwd-more.json --S 65536 --programs fwd_rows rowgroup",
        f"{out}/tune-fwd.json --S 2048 32768",
        f"{out}/tune-fwd-more.json --S 65536 --programs fwd_rows rowgroup",
    ]


def test_tune_parts_without_overrides_run_one_pass_per_variant(tmp_path):
    calls = _run(tmp_path, "tune-parts", TUNE_VARIANTS="bwd_dt fwd_dt")
    assert calls == [f"{tmp_path}/out/tune-bwd_dt.json", f"{tmp_path}/out/tune-fwd_dt.json"]
