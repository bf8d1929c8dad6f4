"""The maintained tools under tools/ run where they can without a GPU: the host profile on its
no-op launcher, the sanitizer's cases listed (their runs need compute-sanitizer and a GPU), the
kernel statistics compiled with NVRTC."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import ROOT, load_module

from conv1d_silu import kernels, routes


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


def test_warm_kernels_compiles_the_listed_instances_once_and_drops_stale_ones(tmp_path, monkeypatch, capsys):
    """tools/warm_kernels.py: each distinct (source, instance) of the list compiled once, malformed
    lines ignored, an instance the source no longer has dropped from the rewritten list."""
    from conv1d_silu import runtime

    warm = load_module("tools/warm_kernels.py")
    listed = tmp_path / "instances.txt"
    listed.write_text(
        "conv1d_silu_fwd\tconv1d_silu_fwd<float, 1>\n"
        "conv1d_silu_bwd\tconv1d_silu_bwd<float, 2>\n"
        "no tab here\n"
        "conv1d_silu_fwd\tconv1d_silu_fwd<float, 1>\n"
        "conv1d_silu_fwd\tconv1d_silu_fwd<old, 3>\n"
    )
    compiled = []

    def function(source, kernel, index):
        compiled.append((source, kernel, index))
        if "old" in kernel:
            raise runtime.CompileError(f"conv1d_silu: NVRTC could not build {kernel}\nlog")

    monkeypatch.setattr(runtime, "function", function)
    monkeypatch.setenv("CONV1D_SILU_RECORD_INSTANCES", str(listed))
    assert warm.main([str(listed), "--jobs", "1"]) == 0
    assert compiled == [
        ("conv1d_silu_fwd", "conv1d_silu_fwd<float, 1>", 0),
        ("conv1d_silu_bwd", "conv1d_silu_bwd<float, 2>", 0),
        ("conv1d_silu_fwd", "conv1d_silu_fwd<old, 3>", 0),
    ]
    assert listed.read_text() == "conv1d_silu_fwd\tconv1d_silu_fwd<float, 1>\nconv1d_silu_bwd\tconv1d_silu_bwd<float, 2>\n"
    out = capsys.readouterr()
    assert "2 of 3 instances ready" in out.out and "1 no longer in the source" in out.out and "<old, 3>" in out.err


def test_the_runtime_lists_what_it_compiles_where_asked(tmp_path, monkeypatch):
    from conv1d_silu import runtime

    listed = tmp_path / "instances.txt"
    monkeypatch.delenv("CONV1D_SILU_RECORD_INSTANCES", raising=False)
    runtime.record_instance("conv1d_silu_fwd", "conv1d_silu_fwd<float>")
    assert not listed.exists()
    monkeypatch.setenv("CONV1D_SILU_RECORD_INSTANCES", str(listed))
    runtime.record_instance("conv1d_silu_fwd", "conv1d_silu_fwd<float>")
    runtime.record_instance("conv1d_silu_bwd", "conv1d_silu_bwd<float>")
    warm = load_module("tools/warm_kernels.py")
    assert warm.instances(listed) == [("conv1d_silu_fwd", "conv1d_silu_fwd<float>"), ("conv1d_silu_bwd", "conv1d_silu_bwd<float>")]


def test_profile_cases_name_their_shape_layout_and_program():
    profile = load_module("tools/profile_kernels.py")
    assert profile.parse("bwd:250340:384:rowgroup_long_8b") == ("bwd", (250340, 384), 384, "BLC", "rowgroup_long_8b", True)
    assert profile.parse("bwd:8x2048:1024:bwd_bcl:nobias") == ("bwd", (8, 1024, 2048), 1024, "BCL", "bwd_bcl", False)
    assert profile.parse("add:8x2048:1024") == ("add", (8, 1024, 2048), 1024, "BCL", None, True)
    assert profile.parse("cc1d:8x2048:2560") == ("cc1d", (8, 2560, 2048), 2560, "BCL", None, True)


def test_kernel_stats_reports_registers_spills_and_the_instruction_mix(monkeypatch):
    """tools/kernel_stats.py compiles an instance as the runtime does (NVRTC, its options) and reads
    ptxas's registers and spills; a cuobjdump listing gives the opcodes, predicates aside."""
    pytest.importorskip("cuda.bindings", reason="NVRTC comes with the test extra's cuda-bindings")
    stats = load_module("tools/kernel_stats.py")
    assert [stats.source_of(e) for e in ("conv1d_silu_fold<x>", "conv1d_silu_bwd_bcl<x>", "conv1d_silu_update<x>")] == [
        "conv1d_silu_bwd", "conv1d_silu_bcl", "conv1d_silu_update"]
    expr = kernels.name_expression("conv1d_silu_update", torch.float32, torch.float32, 4, True, True, False, False)
    s = stats.stats(expr)
    assert 0 < s["registers"] <= 255 and s["spill_bytes"] == 0 and s["ops"] is None
    listing = "\n".join([
        "        /*0040*/                   FFMA R3, R2, R4, R3 ;     /* 0x0000000402037223 */",
        "        /*0050*/              @!P0 BRA 0x80 ;                /* 0x000000000000094d */",
        "        /*0060*/              @P1  FFMA R5, R2, R4, R5 ;     /* 0x0000000402057223 */",
        "   Function : _Z18conv1d_silu_update",
    ])
    ops = [m.group(1) for m in map(stats.SASS_LINE.match, listing.splitlines()) if m]
    assert ops == ["FFMA", "BRA", "FFMA"]


SETUP_PY = '''
cc_flag = []
if HIP_BUILD:
    cc_flag.append("-DBUILD_PYTHON_PACKAGE")
else:
    cc_flag.append("-gencode")
    cc_flag.append("arch=compute_80,code=sm_80")
    if bare_metal_version >= Version("11.8"):
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_90,code=sm_90")
    if bare_metal_version >= Version("12.8"):
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_100,code=sm_100")
'''

DISPATCH = '''#define DISPATCH_ITYPE(ITYPE, NAME, ...)                    \\
    if (ITYPE == at::ScalarType::Half) {                                            \\
        using input_t = at::Half;                                                   \\
        __VA_ARGS__();                                                              \\
    } else if (ITYPE == at::ScalarType::BFloat16) {                                 \\
        using input_t = at::BFloat16;                                               \\
        __VA_ARGS__();                                                              \\
    } else {                                                                        \\
        AT_ERROR(#NAME, " not implemented");                                        \\
    }
'''


def test_the_peer_build_compiles_one_architecture_and_no_fp16(tmp_path):
    """tools/build_causal_conv1d.py rewrites causal-conv1d's build for one arch and the bf16 / fp32
    kernels: one -gencode pair left, valid Python, and fp16 gone from the instances and the dispatch
    (the peer's own sources come from outside; these are their shapes)."""
    build = load_module("tools/build_causal_conv1d.py")
    setup = build.one_arch(SETUP_PY, "sm_90")
    compile(setup, "setup.py", "exec")
    assert setup.count('"-gencode"') == 1 and '"arch=compute_90,code=sm_90"' in setup
    assert "sm_80" not in setup and "sm_100" not in setup
    flags = {"HIP_BUILD": False, "bare_metal_version": 13, "Version": lambda v: float(v)}
    exec(setup, flags)  # every version check passed: still the one target
    assert flags["cc_flag"] == ["-gencode", "arch=compute_90,code=sm_90"]
    assert build.one_arch(setup, "sm_90") == setup, "a patched setup.py stays as it is"
    assert build.one_arch(setup, "sm_100").count("compute_") == 1 and "compute_100" in build.one_arch(setup, "sm_100")
    with pytest.raises(RuntimeError, match="no cc_flag -gencode pairs"):
        build.one_arch("cc_flag = []\n", "sm_90")
    with pytest.raises(RuntimeError, match="not one `cc_flag = \\[\\]`"):
        build.one_arch("flags = []\n", "sm_90")

    cu = ("template void f<at::Half, float>(P &p, cudaStream_t s);\n"
          "template void f<at::BFloat16, float>(P &p, cudaStream_t s);\n"
          "template void f<float, at::Half>(P &p, cudaStream_t s);\n")
    assert build.without_fp16(cu) == "template void f<at::BFloat16, float>(P &p, cudaStream_t s);\n"
    lean = build.without_fp16(DISPATCH)
    assert "at::Half" not in lean and "if (ITYPE == at::ScalarType::BFloat16) {" in lean

    src = tmp_path / "causal-conv1d"
    (src / "csrc").mkdir(parents=True)
    (src / "setup.py").write_text(SETUP_PY)
    (src / "csrc" / "fwd.cu").write_text(cu)
    (src / "csrc" / "causal_conv1d.cpp").write_text(DISPATCH)
    build.patch(src, "sm_90", all_dtypes=False)
    assert "at::Half" not in (src / "csrc" / "fwd.cu").read_text() + (src / "csrc" / "causal_conv1d.cpp").read_text()
    (src / "csrc" / "causal_conv1d.cpp").write_text(DISPATCH.replace("ScalarType::Half) {", "ScalarType::Half)  {"))
    with pytest.raises(RuntimeError, match="fp16 left"):  # a layout the patch does not know fails loudly
        build.patch(src, "sm_90", all_dtypes=False)


def test_the_peer_build_builds_once_and_checks_what_it_imports(tmp_path, monkeypatch, capsys):
    """main(): a tree without setup.py is refused; one whose extension imports is left alone; else it
    is patched, built in place with CAUSAL_CONV1D_FORCE_BUILD, stripped, and must import from there."""
    build = load_module("tools/build_causal_conv1d.py")
    src = tmp_path / "causal-conv1d"
    with pytest.raises(SystemExit, match="no setup.py"):
        build.main([str(src), "--arch", "sm_90"])
    (src / "csrc").mkdir(parents=True)
    (src / "setup.py").write_text(SETUP_PY)
    (src / "csrc" / "causal_conv1d.cpp").write_text(DISPATCH)
    monkeypatch.setattr(build, "imports", lambda path: None)
    assert build.main([str(src), "--arch", "sm_90"]) == 0
    assert "already built" in capsys.readouterr().out and (src / "setup.py").read_text() == SETUP_PY

    runs, built = [], []

    def run(cmd, **kw):
        runs.append((cmd, kw))
        if "build_ext" in cmd:
            (src / "causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\0" * 1024)
            built.append(True)

    monkeypatch.setattr(build.subprocess, "run", run)
    monkeypatch.setattr(build, "imports", lambda path: None if built else "ModuleNotFoundError")
    assert build.main([str(src), "--arch", "sm_90", "--jobs", "3"]) == 0
    cmd, kw = runs[0]
    assert cmd[1:] == ["setup.py", "build_ext", "--inplace"] and kw["cwd"] == src.resolve()
    assert kw["env"]["CAUSAL_CONV1D_FORCE_BUILD"] == "TRUE" and kw["env"]["MAX_JOBS"] == "3"
    assert '"arch=compute_90,code=sm_90"' in (src / "setup.py").read_text()
    assert "at::Half" not in (src / "csrc" / "causal_conv1d.cpp").read_text()
    if build.shutil.which("strip"):
        assert runs[1][0][1] == "--strip-debug"
    monkeypatch.setattr(build, "imports", lambda path: "causal_conv1d_cuda comes from /elsewhere")
    with pytest.raises(RuntimeError, match="not importable .*: causal_conv1d_cuda comes from /elsewhere"):
        build.main([str(src), "--arch", "sm_90"])
