"""The maintained tools under tools/ run where they can without a GPU: the host profile on its
no-op launcher, and the sanitizer's cases listed (their runs need compute-sanitizer and a GPU)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT, load_module

from conv1d_silu import routes


def test_host_profile_runs_on_the_cpu_with_its_no_op_launcher():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "host_profile.py"), "--noop", "--calls", "30"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("theirs: ") and lines[1].startswith("ours: ")
    assert "function calls" in run.stdout and "conv1d_silu" in run.stdout  # the profile names our frames


def test_sanitize_cases_cover_every_cuda_program(capsys):
    cases = load_module("tools/sanitize_cases.py")
    assert cases.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("case ") == len(cases.CASES)
    cuda = {name for name, p in routes.PROGRAMS.items() if p.direction in ("fwd", "bwd")}
    assert set(cases.PROGRAMS) == cuda and all(name in out.split() for name in cuda)
