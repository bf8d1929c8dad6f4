"""GPU-only properties: sizes and channel counts of training shapes against the float64
reference, CUDA-graph capture, torch.compile on CUDA, concurrent streams."""

from __future__ import annotations

import pytest
import torch

from conv1d_silu import CausalConv1dSiLU, causal_conv1d_silu, reference
from conv1d_silu.documents import doc_table
from conftest import cuda_only
from helpers import assert_close, make_case

pytestmark = [cuda_only, pytest.mark.timeout(900)]


def _ref64(x, w, b, dy, **kw):
    """float64 reference on the GPU: y, dx, dweight, dbias."""
    x64, w64 = x.double(), w.double()
    b64 = b.double() if b is not None else None
    doc = doc_table(x, kw.get("seq_idx"), kw.get("cu_seqlens"), None)
    y, _ = reference.forward(x64, w64, b64, doc, None, False, True)
    dx, dw, db, _ = reference.backward(dy.double(), x64, w64, b64, doc, None, None, True, torch.float64)
    return y, dx, dw, db


@pytest.mark.parametrize("C", [1, 7, 264, 344, 384, 1000, 4096])
@pytest.mark.parametrize("S", [0, 1, 3, 1000, 65600])
def test_training_shapes_match_reference(S, C):
    if S * C > 65600 * 1000 and C == 4096:
        S = 16384 + 3
    K = 4
    case = make_case(S, C, K, "single", dtype=torch.bfloat16, device="cuda", seed=S + C)
    x = case["x"].requires_grad_()
    w = case["weight"].requires_grad_()
    b = case["bias"].requires_grad_()
    y = causal_conv1d_silu(x, w, b)
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    ry, rdx, rdw, rdb = _ref64(x.detach(), w.detach(), b.detach(), dy)
    assert_close(y, ry, torch.bfloat16, "y")
    assert_close(dx, rdx, torch.bfloat16, "dx")
    assert_close(dw, rdw, torch.bfloat16, "dweight")
    assert_close(db, rdb, torch.bfloat16, "dbias")


@pytest.mark.parametrize("S", [65536 + 17, 262144])
def test_documents_at_scale(S):
    case = make_case(S, 384, 4, "cu_seqlens", dtype=torch.bfloat16, device="cuda", seed=3)
    x, w, b = (case[k].requires_grad_() for k in ("x", "weight", "bias"))
    y = causal_conv1d_silu(x, w, b, cu_seqlens=case["cu_seqlens"])
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    ry, rdx, rdw, rdb = _ref64(x.detach(), w.detach(), b.detach(), dy, cu_seqlens=case["cu_seqlens"])
    for name, got, want in (("y", y, ry), ("dx", dx, rdx), ("dweight", dw, rdw), ("dbias", db, rdb)):
        assert_close(got, want, torch.bfloat16, name)


def _step(model, x, cu):
    y = model(x, cu_seqlens=cu)
    loss = (y.float() ** 2).mean()
    loss.backward()
    return loss


def test_cuda_graph_replays_full_step_with_same_bits():
    torch.manual_seed(1)
    model = CausalConv1dSiLU(264, 4).cuda().to(torch.bfloat16)
    x = torch.randn(4096, 264, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, 100, 2000, 4096], dtype=torch.int32, device="cuda")
    # eager reference step
    _step(model, x, cu)
    eager = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    # capture after a warm-up on a side stream (kernels compiled, allocator warmed)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model.zero_grad(set_to_none=False)
            x.grad.zero_()
            _step(model, x, cu)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=False)
    x.grad.zero_()
    with torch.cuda.graph(g):
        _step(model, x, cu)
    for _ in range(3):
        model.zero_grad(set_to_none=False)
        x.grad.zero_()
        g.replay()
        torch.cuda.synchronize()
        got = [p.grad for p in model.parameters()] + [x.grad]
        for a, b in zip(eager, got):
            assert torch.equal(a, b)


@pytest.mark.parametrize("program", ["rowgroup_8b", "rowgroup_long_8b", "rowgroup_sm"])
def test_captured_backward_takes_tickets_zeroed_ahead(program, ticket_climb):
    """A captured backward takes its tickets from the reserve zeroed outside the capture (no memset
    node in the graph); every replay gives the eager bits and leaves the tickets at zero. With the
    reserve used up, the capture falls back to zeros of its own, with the same bits. (The tickets'
    climb forced: at this size the fold launch would otherwise climb the tree.)"""
    from conv1d_silu import gpu, ops

    torch.manual_seed(4)
    x = torch.randn(70000, 72, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(72, 4, device="cuda"), torch.randn(72, device="cuda")
    dy = torch.randn_like(x)
    doc = doc_table(x, None, None, None)

    def call():
        return ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, program)

    eager = call()  # also tops the reserve up, outside any capture
    reserve = gpu._reserves[torch.cuda.current_device()]
    for exhausted in (False, True):
        buf, used = reserve.buf, reserve.used
        if exhausted:
            reserve.used = buf.numel()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = call()
        if exhausted:
            assert reserve.used == buf.numel()
        else:
            assert reserve.used > used, "the capture did not take its tickets from the reserve"
        for _ in range(3):
            g.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, c) for a, c in zip(out[:3], eager[:3]))
            assert int(buf.count_nonzero()) == 0
        if exhausted:
            reserve.used = used


@pytest.mark.parametrize("program", ["rowgroup_8b", "rowgroup_long_8b", "rowgroup_sm", "rowgroup_flat2_8b"])
def test_captured_fold_launch_replays_with_eager_bits(program):
    """The tree above the CTAs folded by the programmatically launched second kernel: captured in a
    CUDA graph, every replay gives the eager bits, also right behind other work on the stream and
    with the fp32 main-grad accumulation."""
    from conv1d_silu import gpu, ops, routes

    torch.manual_seed(5)
    x = torch.randn(70000, 72, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(72, 4, device="cuda"), torch.randn(72, device="cuda")
    dy = torch.randn_like(x)
    doc = doc_table(x, None, None, None)
    cta_level = routes.PROGRAMS[program].cta_level
    assert gpu.split_fold(gpu.tree_shape(70000)[1][cta_level])
    main_w, main_b = torch.zeros(72, 4, device="cuda"), torch.zeros(72, device="cuda")

    def call():
        main_w.zero_(), main_b.zero_()
        out = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, program)
        ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, program, main_w, main_b)
        return out

    eager = [t.clone() for t in call()[:3]] + [main_w.clone(), main_b.clone()]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        busy @ busy  # a long kernel just before the replay
        g.replay()
        torch.cuda.synchronize()
        for a, c in zip(eager, [*out[:3], main_w, main_b]):
            assert torch.equal(a, c)


def test_plain_launches_give_the_programmatic_bits(monkeypatch):
    """GPUs before sm_90 (or drivers before CUDA 12.3) launch the fold kernel plainly, stream-ordered;
    forced here on this GPU, the bits are those of the programmatic launch."""
    from conv1d_silu import gpu, ops, routes

    torch.manual_seed(6)
    x = torch.randn(70000, 72, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(72, 4, device="cuda"), torch.randn(72, device="cuda")
    dy = torch.randn_like(x)
    doc = doc_table(x, None, None, None)
    assert gpu.split_fold(gpu.tree_shape(70000)[1][routes.PROGRAMS["rowgroup_8b"].cta_level])
    first = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, "rowgroup_8b")
    monkeypatch.setenv("CONV1D_SILU_PROGRAMMATIC", "0")
    second = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.float32, "rowgroup_8b")
    torch.cuda.synchronize()
    assert all(torch.equal(a, c) for a, c in zip(first[:3], second[:3]))


def test_compile_fullgraph_on_cuda_matches_eager_bitwise():
    torch.manual_seed(2)
    model = CausalConv1dSiLU(128, 4).cuda()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for S in (1000, 1500):
        x = torch.randn(S, 128, device="cuda", requires_grad=True)
        outs = []
        for m in (model, compiled):
            model.zero_grad()
            x.grad = None
            y = m(x)
            y.backward(torch.ones_like(y))
            outs.append([y.detach().clone(), x.grad.clone(), model.weight.grad.clone(), model.bias.grad.clone()])
        for a, b in zip(*outs):
            assert torch.equal(a, b)


class _Block(torch.nn.Module):
    """A Mamba-style block's in-projection and short convolution."""

    def __init__(self, C):
        super().__init__()
        self.proj = torch.nn.Linear(C, C, device="cuda", dtype=torch.bfloat16)
        self.conv = CausalConv1dSiLU(C, 4, device="cuda", dtype=torch.bfloat16)

    def forward(self, x):
        return self.conv(self.proj(x))


@pytest.mark.parametrize("train", [False, True])
def test_compile_reduce_overhead_replays_with_eager_bits(train):
    """mode="reduce-overhead" (cudagraph trees): no buffer of ours outlives a call in the graphs'
    memory pool, so the forward and a training step compile, and every replay gives eager's bits."""
    torch.manual_seed(3)
    block, eager = _Block(256), _Block(256)
    eager.load_state_dict(block.state_dict())
    step = torch.compile(block, mode="reduce-overhead")
    for _ in range(4):  # warm-up, recording, replays
        x = torch.randn(2, 512, 256, device="cuda", dtype=torch.bfloat16)
        if not train:
            with torch.no_grad():
                assert torch.equal(step(x), eager(x))
            continue
        dy = torch.randn_like(x)
        for m in (block, eager):
            m.zero_grad(set_to_none=True)
        got, want = step(x), eager(x)
        got.backward(dy)
        want.backward(dy)
        assert torch.equal(got, want)
        for a, b in zip(block.parameters(), eager.parameters()):
            assert torch.equal(a.grad, b.grad)


def test_two_streams_give_serial_bits():
    case = make_case(20000, 264, 4, "single", dtype=torch.bfloat16, device="cuda", seed=5)
    x, w, b = case["x"], case["weight"].requires_grad_(), case["bias"].requires_grad_()
    xs = [x.clone().requires_grad_() for _ in range(2)]
    dys = [torch.randn_like(x) for _ in range(2)]

    def grads(i):
        y = causal_conv1d_silu(xs[i], w, b)
        return torch.autograd.grad(y, [xs[i], w, b], dys[i])

    serial = [grads(0), grads(1)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    results = [None, None]
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            results[i] = grads(i)
    torch.cuda.synchronize()
    for a_set, b_set in zip(serial, results):
        for a, b in zip(a_set, b_set):
            assert torch.equal(a, b)


def test_tensor_on_another_device_than_current():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(500, 64, device="cuda:1", requires_grad=True)
    w = torch.randn(64, 4, device="cuda:1", requires_grad=True)
    with torch.cuda.device(0):
        y = causal_conv1d_silu(x, w)
        y.sum().backward()
    ref = reference.forward(x.detach().double(), w.detach().double(), None, doc_table(x, None, None, None), None, False, True)[0]
    assert_close(y, ref, torch.float32, "y")
