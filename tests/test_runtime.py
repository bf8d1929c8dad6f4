"""Launch validation (pure Python), planning geometry, and the CuPy-free import path."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch

from conv1d_silu import gpu, kernels, routes, runtime
from conv1d_silu.runtime import DeviceLimits, Launch, overlaps, validate

LIMITS = DeviceLimits(sm_count=132, max_threads=1024, smem_default=48 * 1024, smem_optin=227 * 1024)


def launch(**kw):
    base = dict(source="conv1d_silu_bwd", kernel="k", grid=(10, 1, 1), block=256, smem=0, args={})
    base.update(kw)
    return Launch(**base)


def test_validate_accepts_a_good_launch():
    validate(launch(), LIMITS)


def test_validate_rejects_2d_grid_for_one_d_programs():
    with pytest.raises(ValueError, match="1-D grid"):
        validate(launch(grid=(10, 2, 1)), LIMITS)


def test_validate_rejects_block_and_grid_out_of_range():
    with pytest.raises(ValueError, match="block"):
        validate(launch(block=2048), LIMITS)
    with pytest.raises(ValueError, match="grid"):
        validate(launch(grid=(0, 1, 1)), LIMITS)


def test_validate_rejects_too_much_shared_memory():
    with pytest.raises(ValueError, match="shared memory"):
        validate(launch(smem=300 * 1024), LIMITS)


def test_validate_requires_64_bit_indexing_for_big_offsets():
    with pytest.raises(ValueError, match="64-bit"):
        validate(launch(max_offset=2**31), LIMITS)
    validate(launch(max_offset=2**31, index_64=True), LIMITS)


def test_validate_rejects_outputs_overlapping_inputs():
    x = torch.randn(100, 8)
    with pytest.raises(ValueError, match="overlaps"):
        validate(launch(outputs=(x[10:20],), inputs=(x,)), LIMITS)
    validate(launch(outputs=(torch.empty(100, 8),), inputs=(x,)), LIMITS)


def test_overlap_of_strided_views():
    buf = torch.randn(10, 16)
    assert not overlaps(buf[:, :8], torch.randn(3))
    assert overlaps(buf[:, :8], buf[:, 8:])  # interleaved rows share the byte range


def test_vector_width_follows_alignment():
    x = torch.randn(64, 24, dtype=torch.bfloat16)
    assert gpu.alignment(x) == 16 and gpu.alignment(x[:, 2:]) == 4 and gpu.alignment(None) == 16
    assert gpu.vector_width(2, 4, 24, 16, (24,), bwd=True) == 8
    assert gpu.vector_width(2, 8, 24, 16, (24,), bwd=True) == 4  # backward caps VEC * K at 32
    assert gpu.vector_width(2, 5, 24, 16, (24,), bwd=True) == 4  # ... to a power of two
    assert gpu.vector_width(2, 4, 7, 16, (7,), bwd=False) == 1
    assert gpu.vector_width(2, 4, 24, 4, (24,), bwd=False) == 2  # address aligned to 4 bytes only
    assert gpu.vector_width(4, 4, 24, 16, (28,), bwd=False) == 4
    assert gpu.vector_width(8, 4, 24, 16, (24,), bwd=False) == 2


def test_plans_are_cached_pure_functions():
    p = routes.PROGRAMS["rowgroup"]
    a = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 384, 250340, 384, 384, 16, True, 0, False, True, p, 1)
    b = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 384, 250340, 384, 384, 16, True, 0, False, True, p, 1)
    assert a is b
    assert a.block == 8 * 24 and a.n_ctiles == 2 and a.root == 5
    # 978 nodes at the CTAs' level: the fold kernel takes the 4 levels above them from the workspace
    # (60 CTAs: 12 x 32 channels x 5 reduced rows; shared memory for 123 + 16 parents), no tickets
    assert a.n_units == 978 * 2 and a.ws_elems == 978 * 5 * 384 and a.n_tickets == 0
    assert a.fold == gpu.FoldPlan("conv1d_silu_fold<c1s::bf16, c1s::bf16, 4, true>", 60, (123 + 16) * 32 * 4, 978, 4)
    # 4096 nodes at 1M tokens: the tickets climb, every level above the CTAs' in the workspace
    c = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 384, 1 << 20, 384, 384, 16, True, 0, False, True, p, 1)
    assert c.fold is None and c.ws_elems == (4096 + 512 + 64 + 8) * 5 * 384 and c.n_tickets == (512 + 64 + 8 + 1) * 2


def test_flat_forward_plan_covers_whole_rows_with_every_thread():
    flat, tiled = routes.PROGRAMS["fwd_flat16_8b"], routes.PROGRAMS["fwd_rows16_8b_a32"]
    a = gpu.forward_plan(torch.bfloat16, torch.bfloat16, 4, 392, 250340, 392, 16, False, 0, False, False, True, flat, 1)
    assert (a.tile_v, a.n_ctiles, a.block) == (98, 1, 256)  # one tile per row of 98 8-byte vectors
    assert a.n_units == math.ceil(math.ceil(250340 / 16) * 98 / 256)  # every (lane, vector) pair once
    b = gpu.forward_plan(torch.bfloat16, torch.bfloat16, 4, 392, 250340, 392, 16, False, 0, False, False, True, tiled, 1)
    assert (b.tile_v, b.n_ctiles, b.block) == (20, 5, 8 * 20)  # LANES whole lanes per CTA
    assert b.n_units == math.ceil(250340 / (8 * 16)) * 5
    c = gpu.forward_plan(torch.bfloat16, torch.bfloat16, 4, 392, 5, 392, 16, False, 0, False, False, True, flat, 1)
    assert (c.block, c.n_units) == (98, 1)  # one lane: no CTA larger than the work


def test_flat_forward_lanes_grow_only_to_save_a_second_wave():
    """With 528 resident CTAs (132 SMs x 4, the bf16 flat forward on sm_90) at 32768 tokens: C = 264
    fills exactly one wave of 16-token lanes; 272, 296 and 408 spill part of a second wave and take
    the shortest lanes that fit one wave (17, 18, 25 tokens); 432 would need more than 26; past two
    waves nothing changes."""
    flat = routes.PROGRAMS["fwd_flat16_8b"]
    units = {C: gpu.flat_forward_units(32768, 16, C // 4) for C in (264, 272, 296, 408, 432)}
    assert units == {264: 528, 272: 544, 296: 592, 408: 816, 432: 864}
    rows = {C: gpu.wave_filling_rows(32768, C // 4, 16, flat.max_fill_rows, 528) for C in units}
    assert rows == {264: 16, 272: 17, 296: 18, 408: 25, 432: 16}
    assert gpu.flat_forward_units(32768, 17, 74) > 528 >= gpu.flat_forward_units(32768, 18, 74)
    assert gpu.wave_filling_rows(65536, 72, 16, 24, 528) == 16  # 1152 CTAs: more than two waves
    args = (torch.bfloat16, torch.bfloat16, 4, 296, 32768, 296, 16, False, 0, False, False, True, flat, 1)
    plain, filled = gpu.forward_plan(*args), gpu.forward_plan(*args, 528)
    assert (plain.n_units, filled.n_units, filled.block, filled.tile_v) == (592, 527, 256, 74)
    assert plain.kernel.replace(", 16,", ", 18,") == filled.kernel
    tiled = routes.PROGRAMS["fwd_rows16_8b"]  # no max_fill_rows: the plan ignores the residency
    assert gpu.forward_plan(*args[:-2], tiled, 1, 528) == gpu.forward_plan(*args[:-2], tiled, 1)


def test_flat_backward_plan_has_a_column_per_node_and_vector(request):
    p = routes.PROGRAMS["rowgroup_flat_8b"]
    args = (torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 264, 32768, 264, 264, 16, True, 0, False, True, p, 1)
    a = gpu.backward_plan(*args)
    # 128 level-1 nodes x 66 vectors = 8448 columns, 16 per 128-thread CTA: 528 CTAs, exactly the
    # H200's 132 SMs x 4 resident CTAs
    assert (a.n_vec, a.tile_v, a.block, a.n_units) == (66, 16, 128, 528)
    assert a.n_tickets == 0 and (a.fold.n_nodes, a.fold.levels) == (128, 3)
    request.getfixturevalue("ticket_climb")
    b = gpu.backward_plan(*args)
    assert b.fold is None and b.n_tickets == (16 + 2 + 1) * 66  # one per (parent, vector) at levels 2..4


def test_two_slab_lanes_share_a_level_one_node():
    """Lanes of 2 slabs: 4 lanes per column make one level-1 node (8 slab slots, as with one-slab
    lanes), so the CTA has half the threads of its columns' one-slab lanes and the same tree."""
    p = routes.PROGRAMS["rowgroup_flat2_8b"]
    assert (p.cta_level, p.cta_lanes) == (1, 4)
    assert (routes.PROGRAMS["rowgroup_flat_8b"].cta_lanes, routes.PROGRAMS["rowgroup_long_8b"].cta_level) == (8, 2)
    a = gpu.backward_plan(torch.bfloat16, torch.bfloat16, torch.bfloat16, 4, 264, 32768, 264, 264, 16, True, 0, False,
                          True, p, 1)
    # 128 level-1 nodes x 66 vectors = 8448 columns, 32 per CTA of 4 x 32 threads
    assert (a.n_vec, a.tile_v, a.block, a.n_units) == (66, 32, 128, 264)
    assert (a.fold.n_nodes, a.fold.levels) == (128, 3)
    slots = 8 * 5 * 32 * 4 * 4  # [LANES][K + bias][32 vectors x 4 channels] fp32 accumulators
    assert a.smem == slots + gpu.pipe_bytes(4, 2, 128, 4, 2)


def test_tree_shape():
    assert gpu.tree_shape(1) == (2, [1, 1, 1])
    assert gpu.tree_shape(250340) == (5, [7824, 978, 123, 16, 2, 1])  # 32-token slabs, fan-in 8


def test_import_does_not_touch_cuda_or_cupy():
    code = (
        "import sys, conv1d_silu, torch;"
        "assert 'cupy' not in sys.modules, 'cupy imported';"
        "assert not torch.cuda.is_initialized(), 'cuda initialised'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cuda_tensor_without_cupy_names_the_extra(monkeypatch):
    from conv1d_silu import runtime

    runtime._cupy.cache_clear()
    monkeypatch.setitem(sys.modules, "cupy", None)
    try:
        with pytest.raises(RuntimeError, match=r"conv1d_silu\[cuda\]"):
            runtime.require_cupy()
    finally:
        runtime._cupy.cache_clear()


STRUCTS = {
    "conv1d_silu_fwd": "FwdArgs", "conv1d_silu_bwd": "BwdArgs", "conv1d_silu_fold": "FoldArgs",
    "conv1d_silu_update": "UpdateArgs",
}
SOURCE_OF = {"conv1d_silu_fold": "conv1d_silu_bwd"}  # the fold lives beside the backward


def _struct_fields(struct: str) -> list[tuple[str, str]]:
    """(type, name) of each field of a kernel argument struct, as common.cuh declares it."""
    text = kernels.source("conv1d_silu_fwd")
    body = text[text.index(f"struct {struct} {{") + len(struct) + 9 :]
    decls = [" ".join(d.split()) for d in body[: body.index("};")].split(";") if d.strip()]
    return [tuple(d.rsplit(" ", 1)) for d in decls]


@pytest.mark.parametrize("kernel", sorted(STRUCTS))
def test_host_fields_are_the_structs_fields_in_order_and_eight_bytes_each(kernel):
    """runtime.Args packs kernels.ARGS[kernel] in order as 8-byte slots: the struct must
    declare the same fields in the same order, each a pointer or a long long."""
    fields = _struct_fields(STRUCTS[kernel])
    assert [name for _, name in fields] == list(kernels.ARGS[kernel])
    for ctype, name in fields:
        assert ctype.endswith("*") or ctype == "long long", (ctype, name)


@pytest.mark.parametrize("kernel", sorted(STRUCTS))
def test_each_kernel_takes_its_struct_alone(kernel):
    text = kernels.source(SOURCE_OF.get(kernel, kernel))
    signature = re.search(rf"__global__ void __launch_bounds__\(\d+\) {kernel}\(([^)]*)\)", text)
    assert signature is not None
    assert re.fullmatch(rf"const (__grid_constant__ )?c1s::{STRUCTS[kernel]} a", signature.group(1)), signature.group(1)


@pytest.mark.parametrize("direction,S", [("fwd", 100), ("bwd", 100), ("bwd", 5000), ("update", 3)])
def test_launch_args_fill_the_struct(direction, S):
    """At 5000 tokens the backward's CTAs write 20 tree nodes: a second, programmatic launch folds
    the levels above them (conv1d_silu_fold)."""
    from emulator import EmulatorLauncher

    from conv1d_silu.documents import doc_table

    rec = EmulatorLauncher()
    x = torch.randn(S, 8)
    w = torch.randn(8, 4)
    doc = doc_table(x, None, None, None)
    if direction == "update":
        state, lens, rows = torch.randn(4, 8, 5), torch.tensor([3, 9], dtype=torch.int32), torch.tensor([2, -1])
        gpu.update(torch.randn(2, 8, S), state, w, None, True, lens, rows, launcher=rec)
    elif direction == "fwd":
        gpu.forward(x, w, None, doc, None, False, True, routes.PROGRAMS["fwd_rows"], 8, launcher=rec)
    else:
        gpu.backward(torch.randn_like(x), 8, x, 8, w, None, doc, None, True, torch.float32, routes.PROGRAMS["rowgroup"], launcher=rec)
    names = [launch.kernel.split("<")[0] for launch in rec.launches]
    assert names == (["conv1d_silu_bwd", "conv1d_silu_fold"] if S == 5000 else [f"conv1d_silu_{direction}"])
    assert [launch.programmatic for launch in rec.launches] == [False, True][: len(names)]
    for launch, name in zip(rec.launches, names):
        types = dict((field, ctype) for ctype, field in _struct_fields(STRUCTS[name]))
        args = launch.args  # integer fields, and the pointers a plan leaves null; the call's tensors
        assert set(args.tensors) | set(args.ints) == set(types) and len(launch.tensors) == len(args.tensors)
        for field, value in zip(args.tensors, launch.tensors):
            assert types[field].endswith("*") and (value is None or isinstance(value, torch.Tensor)), (field, value)
            assert (value is None) == (field in args.ints), field
        for field, value in args.ints.items():
            assert type(value) is int, (field, value)
            assert types[field] == "long long" or types[field].endswith("*") and value == 0, (field, value)


@pytest.mark.parametrize("capability,driver,want", [((9, 0), 13000, True), ((9, 0), 12020, False), ((8, 0), 13000, False)])
def test_programmatic_launches_need_sm90_and_a_cuda_12_3_driver(monkeypatch, capability, driver, want):
    import ctypes

    from conv1d_silu import runtime

    class FakeLibcuda:
        def cuDriverGetVersion(self, ref):
            ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = driver
            return 0

    monkeypatch.setattr(runtime, "_libcuda", FakeLibcuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    runtime.programmatic_launches.cache_clear()
    try:
        assert runtime.programmatic_launches(0) is want
    finally:
        runtime.programmatic_launches.cache_clear()


def test_launch_config_structures_match_cuda_h():
    """cuLaunchKernelEx's structures as CUDA 12/13's cuda.h lays them out on 64-bit hosts."""
    import ctypes

    from conv1d_silu import runtime

    assert ctypes.sizeof(runtime._LaunchAttribute) == 72  # id, 4 bytes of padding, a 64-byte union
    assert runtime._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(runtime._LaunchConfig) == 56
    assert (runtime._LaunchConfig.smem.offset, runtime._LaunchConfig.stream.offset) == (24, 32)
    assert (runtime._LaunchConfig.attrs.offset, runtime._LaunchConfig.num_attrs.offset) == (40, 48)
    fold = gpu.fold_launch(torch.float32, torch.float32, 4, 8, True, 20, 2, False)
    prepared = runtime.Prepared(fold, LIMITS, 0, 1, 0, True, _recording_driver([]))
    t = runtime._ThreadParams(prepared)
    attr, cfg = t.attr, t.config
    assert (attr.id, attr.value[0]) == (runtime.PROGRAMMATIC_STREAM_SERIALIZATION, 1)
    assert (tuple(cfg.grid), tuple(cfg.block), cfg.smem) == (fold.grid, (fold.block, 1, 1), fold.smem)
    assert cfg.num_attrs == 1 and ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attr)


def test_pack_args_writes_addresses_zeros_and_ints_in_field_order():
    import ctypes

    from conv1d_silu.runtime import Args, pack_args

    t = torch.zeros(3)
    ints = dict(levels=2**40, accumulate=1, C=7, n_nodes=9)
    args = Args("conv1d_silu_fold", ("dw", "workspace", "db"), workspace=0, db=0, **ints)  # null pointers
    params = pack_args(launch(kernel="conv1d_silu_fold<float, float, 4, true>", args=args, tensors=(t, None, None)))
    assert list(params.slots) == [0, t.data_ptr(), 0, 1, 7, 9, 2**40]
    assert ctypes.c_void_p.from_address(params.pointers_addr).value == ctypes.addressof(params.slots)
    with pytest.raises(ValueError, match="fields"):
        Args("conv1d_silu_fold", ("dw", "workspace", "db"), **ints, extra=1)


def test_prepare_smem_raises_the_limit_once_on_objects_without_attributes(monkeypatch):
    # CuPy's RawKernel takes no new attributes: the raised limit is remembered beside it
    class Kernel:
        __slots__ = ("max_dynamic_shared_size_bytes", "sets")

        def __setattr__(self, name, value):
            if name == "max_dynamic_shared_size_bytes":
                object.__setattr__(self, "sets", getattr(self, "sets", 0) + 1)
            object.__setattr__(self, name, value)

    monkeypatch.setattr(runtime, "device_limits", lambda index: runtime.DeviceLimits(132, 1024, 48 * 1024, 227 * 1024))
    monkeypatch.setattr(runtime, "_smem_ready", {})  # ids of other tests' dead objects may recur
    fn = Kernel()
    runtime._prepare_smem(fn, 1024, 0)
    assert not hasattr(fn, "sets")  # under the default: nothing to raise
    for _ in range(3):
        runtime._prepare_smem(fn, 139264, 0)
    assert fn.max_dynamic_shared_size_bytes == 139264 and fn.sets == 1


def test_prepare_smem_counts_the_static_shared_memory(monkeypatch):
    # the 48 KB default bounds dynamic + static: 48 KB of dynamic memory beside a 4-byte static __shared__
    # variable (the backward's fold plans) needs the raised limit
    class Kernel:
        shared_size_bytes = 4
        max_dynamic_shared_size_bytes = 0

    monkeypatch.setattr(runtime, "device_limits", lambda index: runtime.DeviceLimits(132, 1024, 48 * 1024, 227 * 1024))
    monkeypatch.setattr(runtime, "_smem_ready", {})
    small, exact = Kernel(), Kernel()
    runtime._prepare_smem(small, 48 * 1024 - 4, 0)
    runtime._prepare_smem(exact, 48 * 1024, 0)
    assert small.max_dynamic_shared_size_bytes == 0 and exact.max_dynamic_shared_size_bytes == 48 * 1024


def test_ticket_reserve_hands_out_disjoint_slices():
    """Captured launches each keep tickets of their own, also when threads capture at once."""
    from concurrent.futures import ThreadPoolExecutor

    reserve = gpu._TicketReserve()
    assert reserve.take(1) is None  # nothing zeroed ahead: the capture zeroes its own
    reserve.buf = torch.zeros(4000, dtype=torch.int32)

    def grab(k):
        return [reserve.take(k) for _ in range(50)]

    with ThreadPoolExecutor(8) as pool:
        slices = [t for got in pool.map(grab, [1, 2, 3, 4, 1, 2, 3, 4]) for t in got]
    assert all(t is not None for t in slices)
    spans = sorted((t.storage_offset(), t.numel()) for t in slices)
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert reserve.used == sum(n for _, n in spans) == 1000
    assert reserve.take(3001) is None  # no room left: the capture falls back to zeros of its own


def test_ticket_reserve_keeps_used_up_buffers(monkeypatch):
    """A graph holds only raw pointers into the reserve: topping up must keep the used-up buffer
    alive (were it freed, its memory would go to other tensors while graphs still replay)."""
    monkeypatch.setattr(gpu, "GRAPH_TICKETS", 64)
    reserve = gpu._TicketReserve()
    reserve.top_up(10, torch.device("cpu"))
    first = reserve.buf
    assert reserve.take(60) is not None
    reserve.top_up(10, torch.device("cpu"))  # 4 left: a new buffer
    assert reserve.buf is not first and any(t is first for t in reserve.retired)
    assert int(reserve.buf.count_nonzero()) == 0 and reserve.take(10) is not None


def test_info_prints_the_route_of_every_variant(capsys):
    """``python -m conv1d_silu info --shape S,C [--layout BCL]``: versions, then each variant's program
    and the band that chose it for x in that layout (on a machine without a GPU, sm_90's table)."""
    from conv1d_silu.__main__ import main

    arch = "sm_90" if not torch.cuda.is_available() else ops_arch()
    for layout in ("BLC", "BCL"):
        assert main(["info", "--shape", "16384,2560", "--layout", layout]) == 0
        out = capsys.readouterr().out
        for variant in routes.VARIANTS:
            rule = routes.rule_for(arch, variant, 2560, 16384, 4, "bfloat16", layout)
            assert f"{variant:<15} -> {rule.program:<17} ({rule.condition})" in out


def ops_arch() -> str:
    from conv1d_silu import ops

    return ops._arch(torch.device("cuda"))


def _recording_driver(calls: list, context: int = 0):
    """A stand-in driver that records each launch: ("plain", grid x, block, smem, stream, params) or
    ("programmatic", ...) from the cuLaunchKernelEx configuration, and each context entered."""
    import contextlib

    def plain(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        calls.append(("plain", handle, gx, bx, smem, stream, params))

    def programmatic(ref, handle, params, extra):
        cfg = ref._obj
        calls.append(("programmatic", handle, cfg.grid[0], cfg.block[0], cfg.smem, cfg.stream or 0, params))
        return 0

    @contextlib.contextmanager
    def enter(index):
        calls.append(("enter", index))
        yield

    return runtime.Driver(lambda: context, lambda index: 1000 + index, plain, programmatic, enter)


@pytest.mark.parametrize("env,want", [(None, "programmatic"), ("0", "plain"), ("1", "programmatic")])
def test_programmatic_launches_can_be_forced_off(monkeypatch, env, want):
    """CONV1D_SILU_PROGRAMMATIC=0 sends a launch marked programmatic through cuLaunchKernel: the path
    of every GPU before sm_90, which tests/test_gpu.py runs on an sm_90 GPU for the bits. The switch is
    read by every launch: a launch prepared before it is set follows it."""
    calls = []
    monkeypatch.delenv("CONV1D_SILU_PROGRAMMATIC", raising=False)
    fold = gpu.fold_launch(torch.float32, torch.float32, 4, 8, True, 20, 2, False)
    prepared = runtime.Prepared(fold, LIMITS, 3, 77, 0, True, _recording_driver(calls))
    if env is not None:
        monkeypatch.setenv("CONV1D_SILU_PROGRAMMATIC", env)
    ws, dw, db = torch.zeros(100), torch.zeros(8, 4), torch.zeros(8)
    prepared((ws, dw, db))
    assert [c[0] for c in calls] == [want]
    assert calls[0][1:6] == (77, fold.grid[0], fold.block, fold.smem, 1003)
    # a device without programmatic launches (before sm_90, or an old driver) never takes them
    calls.clear()
    runtime.Prepared(fold, LIMITS, 3, 77, 0, False, _recording_driver(calls))((ws, dw, db))
    assert [c[0] for c in calls] == ["plain"]


def test_a_prepared_launch_packs_what_pack_args_packs():
    """A planned launch's prepared form writes the struct that ``pack_args`` of the bound launch writes
    (addresses of the call's tensors, zeros, integers in field order), launch after launch, in a
    struct of each thread's own; its parameter pointer points at that struct."""
    import ctypes
    import threading

    from conv1d_silu.documents import doc_table

    x, w, b = torch.randn(100, 8), torch.randn(8, 4), torch.randn(8)
    doc = doc_table(x, None, None, None)
    launch, _, _ = gpu.backward_launches(
        x, w, True, doc, False, True, torch.float32, routes.PROGRAMS["rowgroup"], 8, 8, 16, 0, False, gpu.Launcher()
    )
    calls = []
    prepared = runtime.Prepared(launch, LIMITS, 0, 5, 0, True, _recording_driver(calls))

    def call_tensors():
        dy, dx, dw, db = torch.randn_like(x), torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
        ws, tickets = torch.empty(1000), torch.zeros(10, dtype=torch.int32)
        return (x, dy, w, b, None, None, dx, None, dw, db, ws, tickets, None, None)

    seen = []
    for _ in range(2):
        tensors = call_tensors()
        prepared(tensors)
        params = ctypes.c_void_p.from_address(calls[-1][-1]).value  # the struct the launch was given
        slots = list((ctypes.c_int64 * len(launch.args.fields)).from_address(params))
        assert slots == list(runtime.pack_args(launch.bind(tensors, (), ())).slots)
        seen.append(params)
    assert seen[0] == seen[1]  # the same struct, rewritten
    other = []
    thread = threading.Thread(target=lambda: (prepared(call_tensors()), other.append(calls[-1][-1])))
    thread.start()
    thread.join()
    assert ctypes.c_void_p.from_address(other[0]).value != seen[0]  # another thread's own struct
    assert [c[0] for c in calls] == ["plain"] * 3 and {c[5] for c in calls} == {1000}


def test_a_prepared_launch_checks_geometry_once_and_overlap_per_call():
    calls = []
    with pytest.raises(ValueError, match="block"):
        runtime.Prepared(launch(block=2048, args=_fold_args()), LIMITS, 0, 1, 0, False, _recording_driver(calls))
    prepared = runtime.Prepared(launch(args=_fold_args()), LIMITS, 0, 1, 0, False, _recording_driver(calls))
    ws, dw, db = torch.zeros(100), torch.zeros(8, 4), torch.zeros(8)
    with pytest.raises(ValueError, match="overlaps"):
        prepared((ws, dw, db), (ws[10:20],), (ws,))
    prepared((ws, dw, db), (dw,), (ws,))
    assert [c[0] for c in calls] == ["plain"]


def test_a_prepared_launch_enters_the_kernels_context_when_another_is_current():
    calls = []
    prepared = runtime.Prepared(launch(args=_fold_args()), LIMITS, 2, 1, 42, False, _recording_driver(calls, 7))
    prepared((torch.zeros(100), torch.zeros(8, 4), torch.zeros(8)))
    assert [c[0] for c in calls] == ["enter", "plain"] and calls[0][1] == 2


def _fold_args():
    from conv1d_silu.runtime import Args

    return Args("conv1d_silu_fold", gpu.FOLD_TENSORS, accumulate=0, C=8, n_nodes=20, levels=2)


def test_runtime_launch_prepares_a_planned_launch_once_per_device(monkeypatch):
    """runtime.launch (the channel-first and decoding launches, bound per call) prepares the planned
    launch once per device index and keeps it on the planned launch."""
    made = []

    def prepare(planned, device):
        made.append((planned, device))
        return lambda tensors, outputs, inputs: None

    monkeypatch.setattr(runtime, "prepare", prepare)
    planned = launch(args=_fold_args())
    t = (torch.zeros(1), torch.zeros(1), torch.zeros(1))
    for index in (0, 0, 1, 0):
        runtime.launch(planned.bind(t, (), ()), torch.device("cuda", index))
    assert [d.index for _, d in made] == [0, 1] and all(p is planned for p, _ in made)


@pytest.mark.parametrize("env", ["1", "0"])
def test_the_emulator_runs_the_fold_through_the_programmatic_path_unless_forced_off(monkeypatch, env):
    """The emulator calls prepared launches as the GPU does: the fold (marked programmatic) goes
    through cuLaunchKernelEx's configuration unless CONV1D_SILU_PROGRAMMATIC=0, with the same bits."""
    import emulator
    from emulator import EmulatorLauncher

    from conv1d_silu.documents import doc_table

    if not emulator.available():
        pytest.skip("no C++ compiler for the emulator")
    monkeypatch.setenv("CONV1D_SILU_PROGRAMMATIC", env)
    torch.manual_seed(0)
    x, w = torch.randn(5000, 8), torch.randn(8, 4)
    dy = torch.randn_like(x)
    doc = doc_table(x, None, None, None)
    prog = routes.PROGRAMS["rowgroup"]

    def run():
        emulator.PROGRAMMATIC.clear()
        return gpu.backward(dy, 8, x, 8, w, None, doc, None, True, torch.float32, prog, launcher=EmulatorLauncher())

    got = run()
    assert [k.split("<")[0] for k in emulator.PROGRAMMATIC] == (["conv1d_silu_fold"] if env == "1" else [])
    monkeypatch.setenv("CONV1D_SILU_PROGRAMMATIC", "0" if env == "1" else "1")
    again = run()
    assert all(torch.equal(a, c) for a, c in zip(got[:2], again[:2]))


def test_prepare_refuses_a_bad_geometry_before_compiling(monkeypatch):
    """runtime.prepare checks the plan against the device's limits first: too much shared memory is
    refused with its reason, not compiled and then rejected by the driver."""
    monkeypatch.setattr(runtime, "device_limits", lambda index: LIMITS)
    monkeypatch.setattr(runtime, "function", lambda *a: pytest.fail("compiled before the geometry was checked"))
    bad = Launch("conv1d_silu_fwd", "k", (1, 1, 1), 128, LIMITS.smem_optin + 16, None)
    with pytest.raises(ValueError, match="dynamic shared memory exceed"):
        runtime.prepare(bad, torch.device("cuda", 0))


def test_the_kernel_text_is_code_only_so_a_comment_edit_recompiles_nothing(tmp_path, monkeypatch):
    """Comments, trailing blanks and empty lines leave the text that NVRTC compiles and every cache
    keys on; a comment marker inside a string literal is text, and a block comment one space."""
    assert kernels.code_only('a // x "y"\nb "c // d" /* e\n f */g\n\n  // only\nh  \n') == 'a\nb "c // d"  g\nh\n'
    before = {name: kernels.source(name) for name in kernels.SOURCES}
    for f in kernels.KERNEL_DIR.iterdir():
        if f.suffix in (".cu", ".cuh"):  # every comment reworded, and one more comment line each
            text = f.read_text().replace("// ", "// reworded, ").replace("/* ", "/* reworded ")
            (tmp_path / f.name).write_text("// a new first line\n\n" + text)
    monkeypatch.setattr(kernels, "KERNEL_DIR", tmp_path)
    kernels.source.cache_clear()
    try:
        assert {name: kernels.source(name) for name in kernels.SOURCES} == before
    finally:
        kernels.source.cache_clear()
