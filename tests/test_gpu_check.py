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

# Records its arguments and, like the tuner and the bench, writes the file named after --json; a
# build of causal-conv1d takes STUB_BUILD_SECONDS and says when it ends.
STUB = """#!/usr/bin/env bash
echo "{tool} $*" >> "{log}"
case "$*" in *build_causal_conv1d*) sleep ${{STUB_BUILD_SECONDS:-0}}; echo "built" >> "{log}";; esac
while [ $# -gt 0 ]; do [ "$1" = --json ] && echo '{{}}' > "$2"; shift; done
"""


# Records its limit and runs the command it wraps.
TIMEOUT_STUB = """#!/usr/bin/env bash
while [ "${{1#-}}" != "$1" ]; do shift 2; done
echo "timeout $1" >> "{log}"
shift
exec "$@"
"""


def _calls(tmp_path: Path, stages: str, prefix: str = "python3 ", **env: str) -> list[str]:
    """Every python3 call of ``tools/gpu-check STAGES``, without the ``python3 `` in front (with
    ``prefix="timeout "``, the limit of every call run under ``timeout``)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    for tool, text in (("python3", STUB), ("nvidia-smi", STUB), ("timeout", TIMEOUT_STUB)):
        stub = bin_dir / tool
        stub.write_text(text.format(tool=tool, log=log))
        stub.chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
            "CUPY_CACHE_DIR": str(tmp_path / "no-cache"), "CONV1D_SILU_RECORD_INSTANCES": "", **env}
    subprocess.run(["bash", str(ROOT / "tools" / "gpu-check"), *stages.split()], env=full, check=True,
                   capture_output=True, timeout=60)
    return [line.removeprefix(prefix) for line in log.read_text().splitlines() if line.startswith(prefix)]


def _tune_parts(calls: list[str]) -> list[str]:
    """What follows --json in each per-variant tuner call."""
    return [c.split(" --json ")[1] for c in calls if c.startswith("-m conv1d_silu.tune --variants")]


def test_tune_parts_take_per_variant_arguments_and_a_second_pass(tmp_path):
    calls = _calls(tmp_path, "tune-parts", TUNE_VARIANTS="bwd fwd", TUNE_ARGS="--S 2048",
                   TUNE_ARGS_fwd="--S 2048 32768", TUNE_MORE="--S 65536 --programs fwd_rows rowgroup")
    out = tmp_path / "out"
    assert _tune_parts(calls) == [
        f"{out}/tune-bwd.json --S 2048",
        f"{out}/tune-bwd-more.json --S 65536 --programs fwd_rows rowgroup",
        f"{out}/tune-fwd.json --S 2048 32768",
        f"{out}/tune-fwd-more.json --S 65536 --programs fwd_rows rowgroup",
    ]


def test_tune_parts_without_overrides_run_one_pass_per_variant(tmp_path):
    calls = _calls(tmp_path, "tune-parts", TUNE_VARIANTS="bwd_dt fwd_dt")
    assert _tune_parts(calls) == [f"{tmp_path}/out/tune-bwd_dt.json", f"{tmp_path}/out/tune-fwd_dt.json"]


def test_tune_parts_merge_their_dumps_into_a_route_table_under_out(tmp_path):
    out = tmp_path / "out"
    calls = _calls(tmp_path, "tune-parts", TUNE_VARIANTS="bwd fwd")
    assert calls[-1] == (f"-m conv1d_silu.tune --from-json {out}/tune-bwd.json {out}/tune-fwd.json "
                         f"--json {out}/tune.json --out {out}/tune")


def test_tune_writes_its_dump_and_route_table_under_out_never_into_the_package(tmp_path):
    out = tmp_path / "out"
    calls = _calls(tmp_path, "tune programs", TUNE_ARGS="--variants bwd")
    tuner = [c for c in calls if c.startswith("-m conv1d_silu.tune")]
    assert tuner[0] == f"-m conv1d_silu.tune --jobs 14 --json {out}/tune.json --out {out}/tune --variants bwd"
    assert f"--json {out}/tune.json" in tuner[1] and "--out" not in tuner[1]  # programs: times, no table
    assert not any("--write-package" in c for c in calls)


def test_host_profile_runs_the_profile_alone(tmp_path):
    calls = _calls(tmp_path, "host-profile")
    assert [c for c in calls if c.startswith("tools/")] == ["tools/host_profile.py"]


def test_layouts_times_both_layouts_on_the_same_shapes(tmp_path):
    calls = [c for c in _calls(tmp_path, "layouts", LAYOUT_SHAPES="4096,8 8192,16") if "conv1d_silu.bench" in c]
    assert [c.split("--layout ")[1].split()[0] for c in calls] == ["BCL", "BLC"]
    assert all("--shapes 4096,8 8192,16 " in c and "--graph" in c for c in calls)
    assert not any("baseline-programs" in c for c in calls)


def test_tests_compile_the_last_runs_instances_first(tmp_path):
    """The tests stage warms the cache from the instance list kept in it, before pytest; with no
    list (a first run) it goes straight to pytest."""
    cache = tmp_path / "cache"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert not any("warm_kernels" in c for c in _calls(first, "tests", CUPY_CACHE_DIR=str(cache)))
    listed = cache / "conv1d_silu_instances.txt"
    listed.write_text("conv1d_silu_fwd\tconv1d_silu_fwd<float>\n")
    calls = _calls(second, "tests", CUPY_CACHE_DIR=str(cache), WARM_JOBS="3")
    warm = next(i for i, c in enumerate(calls) if c.startswith("tools/warm_kernels.py"))
    assert calls[warm] == f"tools/warm_kernels.py {listed} --jobs 3"
    assert calls.index(next(c for c in calls if c.startswith("-m pytest -q -n"))) > warm


def test_stages_fit_what_the_checks_seconds_leave(tmp_path):
    """Unbounded, each layout run gets LAYOUT_TIMEOUT; with GPU_CHECK_SECONDS (less a 30 s margin)
    the channel-first run gets LAYOUT_BCL_SHARE percent of what is left and the channel-last run
    the rest (the stand-in runs return at once)."""
    for run in "abcd":
        (tmp_path / run).mkdir()
    assert _calls(tmp_path / "a", "layouts", "timeout ", LAYOUT_TIMEOUT="420") == ["420", "420"]
    bcl, blc = map(int, _calls(tmp_path / "b", "layouts", "timeout ", LAYOUT_TIMEOUT="420",
                               GPU_CHECK_SECONDS="230", LAYOUT_BCL_SHARE="50"))
    assert 95 <= bcl <= 100 and 195 <= blc <= 200
    assert _calls(tmp_path / "c", "layouts", "timeout ", LAYOUT_TIMEOUT="150", GPU_CHECK_SECONDS="600") == ["150", "150"]
    assert 65 <= int(*_calls(tmp_path / "d", "bench", "timeout ", GPU_CHECK_SECONDS="100")) <= 70  # every stage


def test_layouts_pass_their_channel_first_options_to_that_run_alone(tmp_path):
    calls = [c for c in _calls(tmp_path, "layouts", LAYOUT_BCL_ARGS="--baseline-programs bwd_bcl_chain2")
             if "conv1d_silu.bench" in c]
    bcl, blc = calls
    assert "--layout BCL --with-channel-last --baseline-programs bwd_bcl_chain2 " in bcl
    assert "baseline-programs" not in blc and "--floor" in bcl and "--floor" in blc


def test_peers_builds_causal_conv1d_and_brings_the_built_tree_back(tmp_path):
    """The peers stage builds causal-conv1d from CC1D_SRC, puts it on PYTHONPATH for the stages
    after it, and returns the tree in parts that unpack to it (so a later call carries it)."""
    src = tmp_path / "peers" / "causal-conv1d"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("# stand-in\n")
    (src / "causal_conv1d_cuda.so").write_bytes(b"built")
    (src / "build").mkdir()
    (src / "build" / "kernel.o").write_bytes(b"object")
    calls = _calls(tmp_path, "peers", CC1D_SRC=str(src))
    assert f"tools/build_causal_conv1d.py {src}" in calls
    out = tmp_path / "out"
    parts = sorted(out.glob("cc1d_built.tgz.*"))
    assert parts and not (out / "peers.txt").exists()  # the log went into logs.tgz, the parts stay
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar xzf - -C {back}", shell=True, check=True)
    assert (back / "causal-conv1d" / "causal_conv1d_cuda.so").read_bytes() == b"built"
    assert not (back / "causal-conv1d" / "build").exists()  # the object files stay behind
    again = tmp_path / "again"
    again.mkdir()
    _calls(again, "peers", CC1D_SRC=str(src), PEERS_KEEP="")  # PEERS_KEEP= : the tree stays there
    assert not list((again / "out").glob("cc1d_built.tgz.*"))


def test_peers_in_the_background_build_while_the_gpu_stages_run(tmp_path):
    """PEERS_BACKGROUND=1: the stages that time no peer run during the build, the first that does
    waits for it; without it the build comes first."""
    src = tmp_path / "peers" / "causal-conv1d"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("# stand-in\n")
    for run, background in (("bg", "1"), ("fg", "")):
        (tmp_path / run).mkdir()
        calls = _calls(tmp_path / run, "peers programs layouts", "", CC1D_SRC=str(src), PEERS_BACKGROUND=background,
                       STUB_BUILD_SECONDS="1", PEERS_KEEP="")
        order = [("build" if "build_causal" in c else "built" if c == "built" else "tune" if "conv1d_silu.tune" in c
                  else "bench" if "conv1d_silu.bench" in c else None) for c in calls]
        order = [o for o in order if o]
        # the build and the tuner start together in the background run: only what ends before what
        built, bench = order.index("built"), order.index("bench")
        if background:
            assert order.index("tune") < built < bench, order
        else:
            assert order.index("build") < built < order.index("tune") < bench, order


def test_peers_without_a_source_says_so_and_builds_nothing(tmp_path):
    calls = _calls(tmp_path, "peers", CC1D_SRC=str(tmp_path / "nowhere"))
    assert not any("build_causal_conv1d" in c for c in calls)
