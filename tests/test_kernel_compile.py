"""Every kernel source compiles for every arch of the route table, with NVRTC (the compiler the
runtime uses; the nvidia-cuda-nvrtc wheel needs no GPU), or with nvcc where NVRTC is missing."""

from __future__ import annotations

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
ARCHS = ["sm_90", "sm_100a", "sm_103a", "sm_107a"]
# CuPy compiles with these on top of the runtime's own options.
CUPY_OPTIONS = ["--device-as-default-execution-space", "-ftz=true"]


def _nvrtc():
    try:
        from cuda.bindings import nvrtc

        err, archs = nvrtc.nvrtcGetSupportedArchs()
        return nvrtc, set(archs)
    except Exception:
        return None, set()


NVRTC, NVRTC_ARCHS = _nvrtc()
NVCC = shutil.which("nvcc")


def _compile_nvrtc(source: str, exprs: list[str], arch: str, extra: tuple[str, ...] = (), code: str = "") -> str:
    from conv1d_silu.runtime import NVRTC_OPTIONS

    code = (code or kernels.source(source)).encode()
    err, prog = NVRTC.nvrtcCreateProgram(code, f"{source}.cu".encode(), 0, [], [])
    for e in exprs:
        NVRTC.nvrtcAddNameExpression(prog, e.encode())
    opts = [o.encode() for o in (*NVRTC_OPTIONS, *CUPY_OPTIONS, f"-arch={arch}", *extra)]
    (err,) = NVRTC.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = NVRTC.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    NVRTC.nvrtcGetProgramLog(prog, log)
    assert err == NVRTC.nvrtcResult.NVRTC_SUCCESS, f"{source} for {arch}:\n{log.decode(errors='replace')}"
    for e in exprs:
        err, lowered = NVRTC.nvrtcGetLoweredName(prog, e.encode())
        assert err == NVRTC.nvrtcResult.NVRTC_SUCCESS and lowered, e
    _, cubin_size = NVRTC.nvrtcGetCUBINSize(prog)
    assert cubin_size > 0
    NVRTC.nvrtcDestroyProgram(prog)
    return log.decode(errors="replace")


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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", kernels.SOURCES)
def test_kernels_compile(source, arch, tmp_path):
    exprs = INSTANCES[source]
    if arch != "sm_90":
        exprs = exprs[:2]  # the full set on our GPU's arch; a representative pair elsewhere
    number = int(arch[3:].rstrip("a"))
    if NVRTC is not None and number in NVRTC_ARCHS:
        _compile_nvrtc(source, exprs, arch)
    elif NVCC is not None and arch != "sm_107a":
        _compile_nvcc(source, exprs, arch, tmp_path)
    else:
        pytest.skip(f"neither NVRTC with {arch} nor nvcc is available")


# The hot sm_90 instances (bf16, K = 4, 8-byte vectors) and the register budget their occupancy
# was measured with: the backward at <= 128 registers fits four 128-thread CTAs per SM
# (rowgroup_8b), the forward at <= 64 four 256-thread ones. More registers, or any spill, is a
# performance regression (docs/performance.md v8).
HOT = [
    ("conv1d_silu_bwd", kernels.name_expression("conv1d_silu_bwd", bf16, bf16, bf16, 4, 4, True, SINGLE, False, True,
                                                "int", spl, pipe_depth(4), flat), 128)
    for spl in (1, 8) for flat in (False, True)
] + [
    ("conv1d_silu_fwd", kernels.name_expression("conv1d_silu_fwd", bf16, bf16, 4, 4, True, SINGLE, False, False, True,
                                                "int", rows, pipe_depth(4)), 64)
    for rows in (16, 32)
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source,expr,max_regs", HOT)
def test_hot_kernels_fit_their_register_budget_without_spills(source, expr, max_regs):
    if NVRTC is None or 90 not in NVRTC_ARCHS:
        pytest.skip("needs NVRTC with sm_90")
    log = _compile_nvrtc(source, [expr], "sm_90", ("--ptxas-options=-v",))
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    assert regs and max(regs) <= max_regs, log
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


def _script(name: str):
    """scripts/<name>.py as a module (the probes are scripts, not a package)."""
    return load_module(f"scripts/{name}.py")


def test_ab_experiment_patches_still_apply():
    """scripts/ab_experiment.py patches the kernels' text; every patch must still find its text."""
    ab = _script("ab_experiment")
    for name, patches in ab.VARIANTS.items():
        for patch in patches:
            target, old, _ = patch if len(patch) == 3 else ("conv1d_silu_bwd", *patch)
            assert old in kernels.source(target), (name, old[:60])


def test_ab_experiment_host_variants(monkeypatch):
    """The host-side variants change what they claim (and only while selected): the deeper row
    pipeline of *deep, no ticket reserve under memset_tickets, no fold launch under no_tree."""
    from conv1d_silu import gpu, runtime

    ab = _script("ab_experiment")
    for obj, attr in ((kernels, "source"), (gpu._TicketReserve, "take"), (gpu, "PREFETCH_ROWS"), (gpu, "FOLD_MAX_NODES")):
        monkeypatch.setattr(obj, attr, getattr(obj, attr))  # restored after the test
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime, "_smem_ready", {})
    base_depth = pipe_depth(4)
    reserve = gpu._TicketReserve()
    reserve.buf = torch.zeros(8, dtype=torch.int32)  # room for a capture's tickets
    ab.use_variant("no_math_deep")
    assert pipe_depth(4) == 1 + ab.DEEP_ROWS // 4 > base_depth
    assert "g[e] = dv[e] + xv[e];" in kernels.source("conv1d_silu_bwd")
    ab.use_variant("memset_tickets")
    assert pipe_depth(4) == base_depth and reserve.take(1) is None
    fold_max = gpu.FOLD_MAX_NODES
    ab.use_variant("no_tree")  # neither the fold launch nor the tickets' climb
    assert gpu.FOLD_MAX_NODES == 0 and "level < climb_to && level < 0" in kernels.source("conv1d_silu_bwd")
    ab.use_variant("window_l1")
    assert gpu.FOLD_MAX_NODES == fold_max and "prefetch.global.L1" in kernels.source("conv1d_silu_bwd")
    ab.use_variant("base")
    assert pipe_depth(4) == base_depth and reserve.take(1) is not None
    gpu.backward_plan.cache_clear()
    gpu.forward_plan.cache_clear()


def test_ab_experiment_padding_probes(monkeypatch, ticket_climb):
    """dx_pad hands the backward a dx whose rows are padded to 64 channels (and its kernel text
    steps by that pitch); node_pad pads every node's flat columns to whole CTAs, so no CTA spans
    two nodes, and leaves tiled plans alone."""
    from conv1d_silu import gpu, routes, runtime

    ab = _script("ab_experiment")
    for obj, attr in ((kernels, "source"), (gpu._TicketReserve, "take"), (gpu, "PREFETCH_ROWS"),
                      (gpu, "torch"), (gpu, "backward_plan"), (gpu, "FOLD_MAX_NODES")):
        monkeypatch.setattr(obj, attr, getattr(obj, attr))
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime, "_smem_ready", {})
    ab.use_variant("dx_pad")
    dx = gpu.torch.empty(torch.Size([5, 264]), dtype=torch.bfloat16, device="cpu")
    assert dx.shape == (5, 264) and dx.stride() == (320, 1)
    assert gpu.torch.empty(torch.Size([5, 256])).is_contiguous()
    assert kernels.source("conv1d_silu_bwd").count(ab.DX_RS) == 2
    args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 264, 70000, 264, 264, 16, True, 0, False, True)
    plain = {n: ab._plan(*args, routes.PROGRAMS[n], 1) for n in ("rowgroup_long_flat32_8b", "rowgroup_8b")}
    ab.use_variant("node_pad")
    ab.pin_ctas(0)
    assert gpu.torch is torch
    flat = gpu.backward_plan(*args, routes.PROGRAMS["rowgroup_long_flat32_8b"], 1)
    assert (plain["rowgroup_long_flat32_8b"].n_vec, flat.n_vec, flat.tile_v) == (66, 96, 32)
    assert flat.n_units == 3 * gpu.tree_shape(70000)[1][2] and flat.n_tickets > plain["rowgroup_long_flat32_8b"].n_tickets
    assert gpu.backward_plan(*args, routes.PROGRAMS["rowgroup_8b"], 1) == plain["rowgroup_8b"]
    ab.use_variant("base")
    ab.pin_ctas(0)
    gpu.forward_plan.cache_clear()


def test_ab_experiment_footprint_probe_walks_adjacent_slabs(monkeypatch):
    """footprint (timing only) moves the eight-slab lanes onto adjacent slabs and nothing else: in the
    emulator, with the math gone (dx[u] = dy[u+K-1] + x[u+K-1]), every dx row is the plain pattern's but
    the K-1 rows before each slab end, whose window now spans the jump to the lane's next slab."""
    import emulator

    from conv1d_silu import gpu, ops, runtime
    from conv1d_silu.tune import _setup

    if not emulator.available():
        pytest.skip("needs g++ for the emulator")
    ab = _script("ab_experiment")
    for obj, attr in ((kernels, "source"), (gpu._TicketReserve, "take"), (gpu, "PREFETCH_ROWS"), (gpu, "torch")):
        monkeypatch.setattr(obj, attr, getattr(obj, attr))
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime, "_smem_ready", {})
    S, C = 4096, 16
    x, dy, w, b, doc, gd = _setup("bwd_bias", S, C, 4, torch.bfloat16, "cpu")
    expect = (dy.float() + x.float()).to(torch.bfloat16)[3:]
    near_slab_end = torch.arange(S - 3) % 32 >= 29
    with ops.use_launcher(emulator.EmulatorLauncher(), emulate_arch="sm_90"):
        for variant, bad in (("no_math_no_ticket_no_fold", torch.zeros_like(near_slab_end)),
                             ("no_math_no_ticket_no_fold_footprint", near_slab_end)):
            ab.use_variant(variant)
            for program in ("rowgroup_long_8b", "rowgroup_long_flat32_8b"):
                dx = ops.backward_impl(dy, x, w, b, doc, None, None, True, gd, program)[0]
                assert torch.equal((dx[:-3] != expect).any(1), bad), (variant, program)
    ab.use_variant("base")
    gpu.backward_plan.cache_clear()
    gpu.forward_plan.cache_clear()


def test_ab_experiment_file_variant_and_program_fields(monkeypatch, tmp_path):
    """file=PATH swaps in the backward's whole source (the forward's stays), and a program name with
    @fields registers that program with those fields changed."""
    from conv1d_silu import gpu, routes, runtime

    ab = _script("ab_experiment")
    for obj, attr in ((kernels, "source"), (gpu._TicketReserve, "take"), (gpu, "PREFETCH_ROWS")):
        monkeypatch.setattr(obj, attr, getattr(obj, attr))
    monkeypatch.setattr(runtime, "_functions", {})
    monkeypatch.setattr(runtime, "_smem_ready", {})
    monkeypatch.setattr(routes, "PROGRAMS", dict(routes.PROGRAMS))
    old = tmp_path / "bwd_old.cu"
    old.write_text("// an older backward\n")
    fwd = kernels.source("conv1d_silu_fwd")
    ab.use_variant(f"file={old}")
    assert kernels.source("conv1d_silu_bwd") == "// an older backward\n"
    assert kernels.source("conv1d_silu_fwd") == fwd
    ab.register_program("fwd_rows16_8b@rows_per_lane=8,max_tile_vectors=16")
    p = routes.PROGRAMS["fwd_rows16_8b@rows_per_lane=8,max_tile_vectors=16"]
    assert (p.rows_per_lane, p.max_tile_vectors, p.vec_bytes) == (8, 16, routes.PROGRAMS["fwd_rows16_8b"].vec_bytes)
    gpu.backward_plan.cache_clear()
    gpu.forward_plan.cache_clear()


def test_stream_probe_compiles():
    """scripts/stream_probe.py's kernel (the access-pattern probe of docs/performance.md v13) still
    compiles, every instance."""
    if NVRTC is None or 90 not in NVRTC_ARCHS:
        pytest.skip("needs NVRTC with sm_90")
    probe = _script("stream_probe")
    _compile_nvrtc("stream_probe", probe.NAMES, "sm_90", code=probe.SOURCE)


def test_runs_probe_compiles():
    """scripts/runs_probe.py's bulk-copy forward (docs/performance.md v38) still compiles, every
    instance it times by default."""
    if NVRTC is None or 90 not in NVRTC_ARCHS:
        pytest.skip("needs NVRTC with sm_90")
    probe = _script("runs_probe")
    _compile_nvrtc("runs_probe", list(probe.names().values()), "sm_90", code=probe.SOURCE)


def test_cta_timeline_patches_still_apply():
    """scripts/cta_timeline.py stamps the kernels' text; every stamp must still find its place."""
    tl = _script("cta_timeline")
    for src in tl.PATCHES:
        assert "c1s_trace[4 * unit + 2]" in tl.patched(src)


def test_sass_loops_reads_loops_and_names():
    """scripts/sass_loops.py: a backward branch and its target make a loop (short ones are left
    out), and each hot instance maps to its own mangled name by its template flags."""
    sl = _script("sass_loops")
    body = "\n".join(f"        /*{0x100 + 16 * i:04x}*/                   FADD R1, R1, R2 ;" for i in range(50))
    sass = body + "\n        /*0420*/              @P0 BRA 0x100 ;\n        /*0430*/              @!P1 BRA 0x400 ;\n"
    assert sl.loops(sass) == (52, [(0x100, 0x420, 51)])
    mangled = [f"_Z15conv1d_silu_bwdIN3c1s4bf16ES1_S1_Li4ELi4ELb{b}ELi0ELb0ELb1EiLi{s}ELi3ELb{f}EEvPKT_"
               for b in (0, 1) for s in (1, 2, 8) for f in (0, 1)]
    found = {expr: [m for m in mangled if sl._matches(m, expr)] for expr in sl.INSTANCES.values()}
    assert all(len(m) == 1 for m in found.values()) and len({m[0] for m in found.values()}) == 12


def test_line_count_model_matches_nsight_counts():
    """scripts/line_count.py reproduces the L2 write requests (dx: no halo) that Nsight Compute counted
    for rowgroup_long_flat32_8b at 1M tokens (docs/performance.md v24): 4194304, 7077888, 6815744 and
    5242880 at C = 256, 264, 272, 320, i.e. exactly 4, 6.75, 6.5 and 5 per row."""
    from conv1d_silu import routes

    lc = _script("line_count")
    program = routes.PROGRAMS["rowgroup_long_flat32_8b"]
    for C, measured in ((256, 4194304), (264, 7077888), (272, 6815744), (320, 5242880)):
        assert lc.backward_requests(program, 1 << 20, C) * (1 << 20) == measured, C
    # an aligned row costs its lines whatever the program; a ragged one more than its lines
    for name in ("rowgroup_8b", "rowgroup_long_8b", "fwd_flat16_8b"):
        p = routes.PROGRAMS[name]
        count = lc.forward_requests if p.direction == "fwd" else lc.backward_requests
        assert count(p, 1 << 20, 384) == 6.0 and count(p, 1 << 20, 264) > 5.0, name
