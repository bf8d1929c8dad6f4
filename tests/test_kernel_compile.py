"""Every kernel source compiles for every arch of the route table and every GPU generation from
Ampere on, with NVRTC 13 (the compiler the runtime uses with the `cuda` extra; the nvidia-cuda-nvrtc
wheel needs no GPU), or with nvcc where NVRTC is missing, and with NVRTC 12 (the `cuda12` extra)."""

from __future__ import annotations

import ctypes
import pathlib
import re
import shutil
import subprocess

import pytest
import torch
from helpers import load_module

from conv1d_silu import kernels
from conv1d_silu.documents import BATCH, CU_SEQLENS, SEQ_IDX, SINGLE
from conv1d_silu.gpu import pipe_depth

bf16, f16, f32, f64 = torch.bfloat16, torch.float16, torch.float32, torch.float64

# (x, weight, grads, K, VEC, bias, doc mode, initial states, silu, index, slabs per lane), then the
# pipeline depth of K
BWD = [
    (bf16, bf16, bf16, 4, 8, True, SINGLE, False, True, "int", 1),
    (bf16, bf16, f32, 4, 8, True, CU_SEQLENS, True, True, "int", 8),
    (bf16, f32, f32, 3, 8, False, SEQ_IDX, True, True, "long long", 1),
    (f16, f16, f16, 8, 4, True, BATCH, True, False, "int", 8),
    (f32, f32, f32, 2, 4, True, SINGLE, False, True, "int", 1),
    (f64, f64, f64, 4, 2, True, CU_SEQLENS, True, True, "int", 1),
    (f64, f64, f32, 8, 1, False, SINGLE, False, True, "long long", 8),
]
# (x, weight, K, VEC, bias, doc mode, initial states, final states, silu, index, rows per lane), then
# the pipeline depth of K
FWD = [
    (bf16, bf16, 4, 8, True, SINGLE, False, False, True, "int", 32),
    (bf16, f32, 8, 8, True, CU_SEQLENS, True, True, True, "long long", 32),
    (f16, f16, 2, 2, False, SEQ_IDX, True, True, False, "int", 32),
    (f32, f32, 3, 4, True, BATCH, False, True, True, "int", 32),
    (f64, f64, 4, 1, True, SINGLE, True, True, True, "int", 32),
]
INSTANCES = {
    "conv1d_silu_bwd": [kernels.name_expression("conv1d_silu_bwd", *a, pipe_depth(a[3]), flat)
                        for a in BWD for flat in (False, True)],
    "conv1d_silu_fwd": [kernels.name_expression("conv1d_silu_fwd", *a, pipe_depth(a[2])) for a in FWD],
}
# (x, weight, K, bias, silu, circular state, state indices)
UPDATE = [
    (bf16, bf16, 4, True, True, False, False),
    (bf16, f32, 4, True, True, True, True),
    (f16, f16, 2, False, False, False, True),
    (f32, f32, 8, True, True, True, False),
    (f64, f64, 3, True, True, False, False),
]
INSTANCES["conv1d_silu_update"] = [kernels.name_expression("conv1d_silu_update", *a) for a in UPDATE]
# channel-first: (x, weight, K, VEC, bias, doc mode, initial states, final states, silu, index), then
# vectors per thread; the backward's own grads dtype after the weight's, no final states
BCL = [
    (bf16, bf16, 4, 8, True, SINGLE, False, False, True, "int"),
    (bf16, f32, 3, 8, False, SEQ_IDX, True, True, True, "long long"),
    (f16, f16, 8, 2, True, CU_SEQLENS, True, True, False, "int"),
    (f32, f32, 2, 4, True, BATCH, True, False, True, "int"),
    (f64, f64, 4, 1, True, SINGLE, True, True, True, "int"),
]
INSTANCES["conv1d_silu_bcl"] = [
    expr for i, a in enumerate(BCL) for expr in (
        kernels.name_expression("conv1d_silu_fwd_bcl", *a, 2),
        kernels.name_expression(
            "conv1d_silu_bwd_bcl", *a[:2], f32 if a[1] != f64 else f64, *a[2:7], *a[8:], i == 0,  # the simple walk
        ),
    )
] + [
    kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, f32, 4, 8, True, BATCH, False, True, "long long", True),
    # the chained round (bwd_bcl_chain2)
    kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, bf16, 4, 8, True, BATCH, False, True, "int", True, 2),
]
INSTANCES["conv1d_silu_bwd"][1:1] = [kernels.name_expression("conv1d_silu_fold", bf16, f32, 4, True)]
# The route table's archs, and the generations below them that causal-conv1d builds for too.
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100a", "sm_103a", "sm_107a", "sm_120"]
# The kernels compile as the runtime compiles them: NVRTC with the runtime's options and the ones
# CuPy adds (tools/kernel_stats.py holds both the options and the compile).
KERNEL_STATS = load_module("tools/kernel_stats.py")
CUPY_OPTIONS = KERNEL_STATS.CUPY_OPTIONS


def _nvrtc():
    try:
        from cuda.bindings import nvrtc

        err, archs = nvrtc.nvrtcGetSupportedArchs()
        return nvrtc, set(archs)
    except Exception:
        return None, set()


NVRTC, NVRTC_ARCHS = _nvrtc()
NVCC = shutil.which("nvcc")


def _compile_nvcc(source: str, exprs: list[str], arch: str, tmp_path) -> None:
    # nvcc spells the instantiations out as explicit template instantiations of the kernels.
    src = tmp_path / f"{source}.cu"
    src.write_text(kernels.with_instances(kernels.source(source), exprs))
    gencode = f"-gencode=arch=compute_{arch[3:]},code={arch}"
    result = subprocess.run(
        [NVCC, "-std=c++17", "-ftz=true", gencode, "-c", str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def _nvrtc12():
    """libnvrtc.so.12 of the nvidia-cuda-nvrtc-cu12 wheel (a test dependency), through ctypes:
    cuda-bindings 13 loads NVRTC 13 only."""
    try:
        import nvidia.cuda_nvrtc

        lib = ctypes.CDLL(str(pathlib.Path(next(iter(nvidia.cuda_nvrtc.__path__))) / "lib" / "libnvrtc.so.12"))
    except (ImportError, OSError):
        return None
    return lib


NVRTC12 = _nvrtc12()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "sm_107a"])  # NVRTC 12.9 has no sm_107a
@pytest.mark.parametrize("source", kernels.SOURCES)
def test_kernels_compile_with_nvrtc_12(source, arch):
    if NVRTC12 is None:
        pytest.skip("needs the nvidia-cuda-nvrtc-cu12 wheel (the test extra installs it)")
    lib = NVRTC12
    prog = ctypes.c_void_p()
    code = kernels.source(source).encode()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), code, f"{source}.cu".encode(), 0, None, None) == 0
    exprs = INSTANCES[source][:2]
    for e in exprs:
        assert lib.nvrtcAddNameExpression(prog, e.encode()) == 0
    from conv1d_silu.runtime import NVRTC_OPTIONS

    opts = [o.encode() for o in (*NVRTC_OPTIONS, *CUPY_OPTIONS, f"-arch={arch}")]
    err = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert err == 0, f"{source} for {arch}:\n{log.value.decode(errors='replace')}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", kernels.SOURCES)
def test_kernels_compile(source, arch, tmp_path):
    exprs = INSTANCES[source]
    if arch != "sm_90":
        exprs = exprs[:2]  # the full set on our GPU's arch; a representative pair elsewhere
    number = int(arch[3:].rstrip("a"))
    if NVRTC is not None and number in NVRTC_ARCHS:
        KERNEL_STATS.compile_nvrtc(source, exprs, arch)
    elif NVCC is not None and arch != "sm_107a":
        _compile_nvcc(source, exprs, arch, tmp_path)
    else:
        pytest.skip(f"neither NVRTC with {arch} nor nvcc is available")


# The hot sm_90 instances (bf16, K = 4, 8-byte vectors) and the register budget their occupancy
# was measured with: the backward at <= 128 registers fits four 128-thread CTAs per SM
# (rowgroup_8b), the forward at <= 64 four 256-thread ones. More registers, or any spill, is a
# performance regression: squeezed to 96 registers (108 bytes of spill stores) the backward takes
# 257.8 µs instead of 199.1 at 262144 x 384 on the H200.
HOT = [
    ("conv1d_silu_bwd", kernels.name_expression("conv1d_silu_bwd", bf16, bf16, bf16, 4, 4, True, SINGLE, False, True,
                                                "int", spl, pipe_depth(4), flat), 128)
    for spl in (1, 8) for flat in (False, True)
] + [
    ("conv1d_silu_fwd", kernels.name_expression("conv1d_silu_fwd", bf16, bf16, 4, 4, True, SINGLE, False, False, True,
                                                "int", rows, pipe_depth(4)), 64)
    for rows in (16, 32)
] + [
    # channel-first (16-byte vectors): the forward; the backward's document walk (two 256-thread CTAs
    # per SM), its simple walk held to four, and with 64-bit offsets, not held, without spills
    ("conv1d_silu_bcl", kernels.name_expression("conv1d_silu_fwd_bcl", bf16, bf16, 4, 8, True, SINGLE, False, False,
                                                True, "int", 2), 64),
    ("conv1d_silu_bcl", kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, bf16, 4, 8, True, SEQ_IDX, False,
                                                True, "int", False), 128),
    ("conv1d_silu_bcl", kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, bf16, 4, 8, True, BATCH, False,
                                                True, "long long", True), 128),
    ("conv1d_silu_bcl", kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, bf16, 4, 8, True, BATCH, False,
                                                True, "int", True), 64),
    # the chained round, held to three CTAs per SM (78 registers: at 64 it spills)
    ("conv1d_silu_bcl", kernels.name_expression("conv1d_silu_bwd_bcl", bf16, bf16, bf16, 4, 8, True, BATCH, False,
                                                True, "int", True, 1), 80),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source,expr,max_regs", HOT)
def test_hot_kernels_fit_their_register_budget_without_spills(source, expr, max_regs):
    if NVRTC is None or 90 not in NVRTC_ARCHS:
        pytest.skip("needs NVRTC with sm_90")
    log, _ = KERNEL_STATS.compile_nvrtc(source, [expr], "sm_90", ("--ptxas-options=-v",))
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    assert regs and max(regs) <= max_regs, log
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log
