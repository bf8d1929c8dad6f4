"""GPU reliability: shapes that break peers, 64-bit indexing, bounded memory, failure paths,
CUDA-graph replay of a whole training step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conv1d_silu import causal_conv1d_silu, gpu, ops, reference
from conv1d_silu.documents import doc_table
from conftest import cuda_only
from helpers import assert_close, make_case

pytestmark = [cuda_only, pytest.mark.timeout(900)]


def _fwd_bwd(case, **kw):
    x, w, b = (case[k].detach().requires_grad_() for k in ("x", "weight", "bias"))
    y = causal_conv1d_silu(x, w, b, **kw)
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    return x.detach(), w.detach(), b.detach(), dy, y, dx, dw, db


def _check_full(case, **kw):
    x, w, b, dy, y, dx, dw, db = _fwd_bwd(case, **kw)
    doc = doc_table(x, kw.get("seq_idx"), kw.get("cu_seqlens"), None)
    ry, _ = reference.forward(x.double(), w.double(), b.double(), doc, None, False, True)
    rdx, rdw, rdb, _ = reference.backward(dy.double(), x.double(), w.double(), b.double(), doc, None, None, True, torch.float64)
    for name, got, want in (("y", y, ry), ("dx", dx, rdx), ("dweight", dw, rdw), ("dbias", db, rdb)):
        assert_close(got, want, x.dtype, name)


@pytest.mark.parametrize("C", [65536, 100000])
def test_very_wide_channels(C):
    _check_full(make_case(300, C, 4, "single", dtype=torch.bfloat16, device="cuda", seed=C))


@pytest.mark.parametrize("C", [1, 3, 257, 1001])
def test_channels_not_multiple_of_8(C):
    case = make_case(5000, C, 4, "cu_seqlens", dtype=torch.bfloat16, device="cuda", seed=C)
    _check_full(case, cu_seqlens=case["cu_seqlens"])


def test_hundred_thousand_documents():
    S, C, K = 200_000, 64, 4
    lengths = torch.randint(1, 4, (100_000,), generator=torch.Generator().manual_seed(0))
    lengths[-1] += S - int(lengths.sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32).cuda()
    case = make_case(S, C, K, "single", dtype=torch.bfloat16, device="cuda", seed=1)
    _check_full(case, cu_seqlens=cu)


@pytest.mark.slow(120)  # seconds on the GPU: 4 GB tensors and a float64 reference in chunks
def test_more_than_2_31_elements_uses_64_bit_offsets():
    S, C, K = 2**21 + 3, 1024, 4
    assert S * C >= 2**31
    torch.manual_seed(0)
    x = torch.randn(S, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, K, device="cuda", dtype=torch.bfloat16) * 0.5
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(S, C, device="cuda", dtype=torch.bfloat16)
    # x itself is the leaf (a clone would be 4 GiB more): the suite shares an 80 GB card with
    # other tests, so the peak stays near 20 GiB and the reference works in small chunks
    x.requires_grad_()
    wr, br = (t.clone().requires_grad_() for t in (w, b))
    y = causal_conv1d_silu(x, wr, br)
    dx, dw, db = torch.autograd.grad(y, [x, wr, br], dy)
    del wr, br
    x = x.detach()
    # rows near the start, around element 2^31 and at the end; each slice is recomputed by the
    # reference with K-1 rows of context on both sides (exact for the rows checked)
    for t0 in (0, 2**31 // C - 5, S - 40):
        n = min(40, S - t0)
        lo, hi = max(0, t0 - (K - 1)), min(S, t0 + n + (K - 1))
        xs = x[lo:hi].double()
        d = doc_table(xs, None, None, None)
        ry, _ = reference.forward(xs, w.double(), b.double(), d, None, False, True)
        rdx, _, _, _ = reference.backward(dy[lo:hi].double(), xs, w.double(), b.double(), d, None, None, True, torch.float64)
        off = t0 - lo
        assert_close(y[t0 : t0 + n], ry[off : off + n], torch.bfloat16, f"y@{t0}")
        assert_close(dx[t0 : t0 + n], rdx[off : off + n], torch.bfloat16, f"dx@{t0}")
    del y, dx
    # dweight: fp64 reference in chunks, each chunk with the K-1 rows before it as its initial state
    want = torch.zeros(C, K, dtype=torch.float64, device="cuda")
    step = 1 << 16
    for lo in range(0, S, step):
        hi = min(S, lo + step)
        init = x[lo - (K - 1) : lo].double()[None] if lo > 0 else None
        xs = x[lo:hi].double()
        d = doc_table(xs, None, None, init)
        _, cdw, _, _ = reference.backward(dy[lo:hi].double(), xs, w.double(), b.double(), d, init, None, True, torch.float64)
        want += cdw
    assert_close(dw, want, torch.bfloat16, "dweight")


def test_backward_allocates_only_dx_and_small_workspaces():
    S, C = 262144, 1024
    case = make_case(S, C, 4, "single", dtype=torch.bfloat16, device="cuda")
    x, w, b = case["x"], case["weight"], case["bias"]
    dy = torch.randn_like(x)
    doc = doc_table(x, None, None, None)
    ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.bfloat16, None)  # warm up (compile)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = ops.backward_impl(dy, x, w, b, doc, None, None, True, torch.bfloat16, None)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    dx_bytes = x.numel() * x.element_size()
    # the workspace: nodes of the canonical tree x (K + 1) x C floats, O(S / 256 * C)
    program = ops.choose("bwd", x, w, True, doc, False, None)
    plan = gpu.backward_plan(x.dtype, w.dtype, w.dtype, 4, C, S, C, C, 16, True, 0, False, True, program, 1)
    small = 4 * (plan.ws_elems + plan.n_tickets) + 2 * 2**20  # + dweight, dbias, allocator rounding
    assert plan.ws_elems * 4 <= 0.05 * dx_bytes
    assert extra <= dx_bytes + small, f"backward took {extra} bytes beyond the inputs; dx is {dx_bytes}"
    del out


def test_graph_replays_training_step_with_optimizer_bitwise():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(128, 264), ).cuda()
    from conv1d_silu import CausalConv1dSiLU

    conv = CausalConv1dSiLU(264, 4).cuda()
    params = list(model.parameters()) + list(conv.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(8192, 128, device="cuda")
    cu = torch.tensor([0, 3000, 8192], dtype=torch.int32, device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = conv(model(x), cu_seqlens=cu).float().pow(2).mean()
        loss.backward()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    snapshot = [p.detach().clone() for p in params]
    with torch.cuda.graph(g):
        step()
    # replay 100 steps twice from the same start: identical parameters and gradients
    results = []
    for _ in range(2):
        with torch.no_grad():
            for p, v in zip(params, snapshot):
                p.copy_(v)
        for _ in range(100):
            g.replay()
        torch.cuda.synchronize()
        results.append([p.detach().clone() for p in params] + [p.grad.clone() for p in params])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _subprocess(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def test_corrupted_kernel_cache_is_rebuilt(tmp_path):
    code = """
        import torch, conv1d_silu
        x = torch.randn(300, 64, device='cuda', requires_grad=True)
        w = torch.randn(64, 3, device='cuda', requires_grad=True)
        y = conv1d_silu.causal_conv1d_silu(x, w)
        y.sum().backward()
        ref = conv1d_silu.causal_conv1d_silu(x.detach().cpu(), w.detach().cpu())
        assert torch.allclose(y.cpu(), ref, atol=1e-4), 'wrong result'
        print('ok')
    """
    env = {"CUPY_CACHE_DIR": str(tmp_path)}
    first = _subprocess(code, env)
    assert first.returncode == 0, first.stderr[-3000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files, "nothing cached"
    for p in files:
        data = bytearray(p.read_bytes())
        for i in range(0, len(data), 97):
            data[i] ^= 0xFF
        p.write_bytes(bytes(data))
    second = _subprocess(code, env)
    assert second.returncode == 0 and "ok" in second.stdout, second.stderr[-3000:]


def test_compile_error_reports_log_and_flags(monkeypatch):
    from conv1d_silu import kernels, runtime

    original = kernels.source

    def broken(name):
        return "this is not C++;\n" if name == "broken" else original(name)

    monkeypatch.setattr(kernels, "source", broken)
    with pytest.raises(runtime.CompileError) as info:
        runtime.function("broken", "conv1d_silu_fwd<float, float, 4, 4, true, 0, false, false, true, int, 32>", 0)
    msg = str(info.value)
    assert "-std=c++17" in msg and "error" in msg.lower()


