"""compat.causal_conv1d_update / causal_conv1d_update_function (and the shipped causal_conv1d_update_ref)
against a token-at-a-time float64 decoder written here from causal-conv1d's semantics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conv1d_silu.compat import causal_conv1d_update, causal_conv1d_update_function, causal_conv1d_update_ref
from helpers import assert_close


def decode_oracle(x, state, weight, bias, silu, start=None):
    """One row at a time, one token at a time: the window is the W-1 columns before the next one
    (the last ones, or those before column ``start % state_len`` of a circular buffer), the token
    is written at the next column. Returns (out (B, D, L), new state), float64."""
    width, state_len = weight.shape[-1], state.shape[-1]
    w, b = weight.reshape(weight.shape[0], width).double(), None if bias is None else bias.double()
    outs, states = [], []
    for row in range(x.shape[0]):
        ring = state[row].double().clone()
        nxt = state_len if start is None else int(start[row]) % state_len
        cols = [(nxt - (width - 1) + j) % state_len for j in range(width - 1)]
        history = torch.cat([ring[:, cols], x[row].double()], -1)
        for t in range(x.shape[-1]):
            if start is None:
                ring = torch.cat([ring[:, 1:], x[row, :, t : t + 1].double()], -1)
            else:
                ring[:, (nxt + t) % state_len] = x[row, :, t].double()
        z = F.conv1d(history[None], w[:, None], b, groups=w.shape[0])[0]
        outs.append(F.silu(z) if silu else z)
        states.append(ring)
    return torch.stack(outs), torch.stack(states)


def _case(
    dev, batch, dim, width, seqlen, state_len, dtype=torch.float32, wdtype=None, entries=None, gen=None
):

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dev, dt)

    x = rnd(batch, seqlen, dim).transpose(1, 2)  # channel-last, as causal-conv1d's tests build it
    state = rnd(entries or batch, state_len, dim).transpose(1, 2)  # mamba2's (B, W, D).transpose(1, 2)
    return x, state, rnd(dim, width, dt=wdtype or dtype), rnd(dim, dt=wdtype or dtype)


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("seqlen", [None, 1, 3, 6])
@pytest.mark.parametrize("extra", [0, 1, 4])  # state_len - (W - 1)
@pytest.mark.parametrize("circular", [False, True])
def test_update(backend, width, seqlen, extra, circular):
    dev = backend.device
    g = torch.Generator().manual_seed(width * 10 + extra)
    x, state, w, b = _case(dev, 3, 8, width, seqlen or 1, width - 1 + extra, gen=g)
    start = torch.tensor([0, 5, 1023], dtype=torch.int32, device=dev) if circular else None
    want, want_state = decode_oracle(
        x.cpu(), state.cpu(), w.cpu(), b.cpu(), True, None if start is None else start.cpu()
    )
    got_state = state.clone()
    ptr = got_state.data_ptr()
    got = causal_conv1d_update(
        x if seqlen else x[..., 0], got_state, w, b, activation="silu", cache_seqlens=start
    )
    assert got_state.data_ptr() == ptr and got_state.stride(1) == 1, "the state is mutated in place"
    assert (
        got.shape == (x.shape if seqlen else x.shape[:2]) and got.stride() == torch.empty_like(got).stride()
    )
    assert_close(got, want if seqlen else want[..., 0], torch.float32, "out")
    assert torch.equal(got_state.cpu().double(), want_state), "state"
    if start is not None:
        assert start.tolist() == [0, 5, 1023], "cache_seqlens is not incremented"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_update_fp32_weight_with_16_bit_x(backend, dtype):
    g = torch.Generator().manual_seed(2)
    x, state, w, b = _case(backend.device, 4, 16, 4, 2, 4, dtype, torch.float32, gen=g)
    want, want_state = decode_oracle(x.cpu(), state.cpu(), w.cpu(), b.cpu(), False)
    got = causal_conv1d_update(x, state, w, b)
    assert got.dtype == dtype and state.dtype == dtype
    assert_close(got, want, dtype, "out")
    assert torch.equal(state.cpu().double(), want_state)


@pytest.mark.parametrize("circular", [False, True])
def test_update_indices_and_padding(backend, circular):
    """Row b uses entry conv_state_indices[b]; a negative index outputs 0 and touches no entry, even
    next to a valid index 0 and when every row is padding."""
    dev = backend.device
    g = torch.Generator().manual_seed(5)
    for idx in ([4, -1, 0], [-1, -3, -1]):
        x, big, w, b = _case(dev, 3, 8, 4, 2, 5, entries=6, gen=g)
        indices = torch.tensor(idx, dtype=torch.int32, device=dev)
        start = torch.tensor([7, 2, 3], dtype=torch.int64, device=dev) if circular else None
        before = big.clone()
        out = causal_conv1d_update(x, big, w, b, "silu", start, indices)
        want_big = before.clone()
        for row, entry in enumerate(idx):
            if entry < 0:
                assert torch.equal(out[row], torch.zeros_like(out[row]))
                continue
            s = None if start is None else start[row : row + 1].cpu()
            want, new = decode_oracle(
                x[row : row + 1].cpu(), before[entry : entry + 1].cpu(), w.cpu(), b.cpu(), True, s
            )
            assert_close(out[row], want[0], torch.float32, "out")
            want_big[entry] = new[0].to(want_big.dtype)
        assert torch.equal(big, want_big), idx


def test_update_function_and_no_autograd(backend):
    dev = backend.device
    x, state, w, b = _case(dev, 2, 8, 3, 2, 2)
    w.requires_grad_()
    want, _ = decode_oracle(x.cpu(), state.cpu(), w.detach().cpu(), b.cpu(), True)
    out = causal_conv1d_update_function(x, state, w, b, True, None, None)
    assert not out.requires_grad, "no autograd, like causal-conv1d's step"
    assert_close(out, want, torch.float32, "out")
    with pytest.raises(ValueError, match="x"):
        causal_conv1d_update_function(x[..., 0], state, w, b, True, None, None)


def test_update_takes_conv1d_weight(backend):
    dev = backend.device
    x, state, w, b = _case(dev, 2, 8, 4, 1, 3)
    want = causal_conv1d_update(x, state.clone(), w, b)
    assert torch.equal(causal_conv1d_update(x, state.clone(), w[:, None, :], b), want)


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("seqlen", [None, 1, 5])
def test_shipped_reference(backend, circular, seqlen):
    """causal_conv1d_update_ref (served to causal-conv1d's own tests) agrees with the oracle."""
    dev = backend.device
    g = torch.Generator().manual_seed(11)
    x, state, w, b = _case(dev, 3, 8, 4, seqlen or 1, 4, gen=g)
    start = torch.tensor([3, 0, 9], dtype=torch.int32, device=dev) if circular else None
    want, want_state = decode_oracle(
        x.cpu(), state.cpu(), w.cpu(), b.cpu(), False, None if start is None else start.cpu()
    )
    got = causal_conv1d_update_ref(x if seqlen else x[..., 0], state, w, b, None, start)
    assert_close(got, want if seqlen else want[..., 0], torch.float32, "out")
    assert torch.equal(state.cpu().double(), want_state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_update_is_cuda_graph_capturable(monkeypatch):
    """A step reads no value on the host: it runs under sync-debug "error" and replays from a CUDA
    graph (the index range check, one host sync, is off with CONV1D_SILU_CHECK_DOCS=0 and while
    capturing)."""
    x, big, w, b = _case("cuda", 3, 16, 4, 1, 4, entries=5)
    indices = torch.tensor([2, -1, 0], dtype=torch.int32, device="cuda")
    start = torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")
    eager_big = big.clone()
    want = causal_conv1d_update(x, eager_big, w, b, "silu", start, indices)
    monkeypatch.setenv("CONV1D_SILU_CHECK_DOCS", "0")
    torch.cuda.set_sync_debug_mode("error")
    try:
        causal_conv1d_update(x, big.clone(), w, b, "silu", start, indices)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.delenv("CONV1D_SILU_CHECK_DOCS")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        causal_conv1d_update(x, big.clone(), w, b, "silu", start, indices)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    captured_big = big.clone()
    with torch.cuda.graph(graph):
        out = causal_conv1d_update(x, captured_big, w, b, "silu", start, indices)
    captured_big.copy_(big)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(captured_big, eager_big)


def _bad_calls():
    x, state, w, b = _case("cpu", 2, 8, 4, 1, 3)
    good = dict(
        x=x, conv_state=state, weight=w, bias=b, activation=None, cache_seqlens=None, conv_state_indices=None
    )
    big = torch.randn(5, 8, 3)
    return [
        (NotImplementedError, "activation", dict(good, activation="relu")),
        (TypeError, "x", dict(good, x=x.to(torch.int32))),
        (ValueError, "x", dict(good, x=x[..., :0])),
        (ValueError, "x", dict(good, x=x[0, 0])),
        (ValueError, "weight", dict(good, weight=torch.randn(8, 9))),
        (ValueError, "weight", dict(good, weight=torch.randn(8, 1))),
        (ValueError, "weight", dict(good, weight=torch.randn(4, 4))),
        (ValueError, "bias", dict(good, bias=torch.randn(4))),
        (TypeError, "bias", dict(good, bias=b.double())),
        (TypeError, "conv_state", dict(good, conv_state=state.half())),
        (ValueError, "conv_state", dict(good, conv_state=torch.randn(2, 8, 2))),
        (ValueError, "conv_state", dict(good, conv_state=torch.randn(2, 4, 3))),
        (ValueError, "conv_state", dict(good, conv_state=torch.randn(3, 8, 3))),
        (ValueError, "conv_state", dict(good, conv_state=torch.randn(1, 8, 3).expand(2, 8, 3))),
        (ValueError, "cache_seqlens", dict(good, cache_seqlens=torch.zeros(3, dtype=torch.int32))),
        (TypeError, "cache_seqlens", dict(good, cache_seqlens=torch.zeros(2))),
        (
            ValueError,
            "conv_state_indices",
            dict(good, conv_state=big, conv_state_indices=torch.zeros(3, dtype=torch.int32)),
        ),
        (TypeError, "conv_state_indices", dict(good, conv_state=big, conv_state_indices=torch.zeros(2))),
        (
            ValueError,
            "conv_state_indices",
            dict(good, conv_state=big, conv_state_indices=torch.tensor([1, 5])),
        ),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_is_named_and_nothing_is_written(case):
    exc, arg, kwargs = _bad_calls()[case]
    before = kwargs["conv_state"].clone()
    with pytest.raises(exc, match=arg):
        causal_conv1d_update(**kwargs)
    assert torch.equal(kwargs["conv_state"], before)


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, None), (torch.bfloat16, None), (torch.float16, torch.float32)])
@pytest.mark.parametrize("width", [2, 3, 4, 8])
@pytest.mark.parametrize("seqlen,extra", [(1, 2), (3, 0), (12, 1)])  # state_len = width - 1 + extra
@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("bias,silu", [(True, True), (False, False)])
def test_update_kernel_is_bitwise_the_forward(kernel_backend, dtype, wdtype, width, seqlen, extra, circular, bias, silu):
    """The decoding kernel sums the taps as the forward kernel does: a step's outputs are bitwise
    the forward's over the same tokens with the step's window as initial states (channel-first x
    and state here, channel-last in the tests above); 12 new tokens pass a whole state."""
    from conv1d_silu import causal_conv1d_silu

    dev = kernel_backend.device
    g = torch.Generator().manual_seed(width * 7 + seqlen)
    state_len = width - 1 + extra
    x = torch.randn(4, 40, seqlen, generator=g).to(dev, dtype)
    state = torch.randn(4, 40, state_len, generator=g).to(dev, dtype)
    w = torch.randn(40, width, generator=g).to(dev, wdtype or dtype)
    b = torch.randn(40, generator=g).to(dev, wdtype or dtype) if bias else None
    start = torch.tensor([0, 2, 7, 1 << 40], device=dev) if circular else None  # int64, one past int32
    nxt = [state_len] * 4 if start is None else [int(s) % state_len for s in start]
    cols = torch.tensor([[(n - (width - 1) + j) % state_len for j in range(width - 1)] for n in nxt], device=dev)
    window = state.gather(2, cols[:, None, :].expand(4, 40, width - 1))
    want = causal_conv1d_silu(
        x, w, b, initial_states=window, activation="silu" if silu else None, layout="BCL"
    )
    got = causal_conv1d_update(x, state, w, b, "silu" if silu else None, start)
    assert torch.equal(got, want)


def test_update_compiles_as_a_mutating_op(backend):
    """Under torch.compile the step is the custom op conv1d_silu::update, which mutates conv_state:
    the compiled step gives eager's output and state."""
    dev = backend.device
    g = torch.Generator().manual_seed(13)
    x, state, w, b = _case(dev, 3, 8, 4, 2, 5, gen=g)
    start = torch.tensor([1, 4, 9], dtype=torch.int32, device=dev)
    want_state = state.clone()
    want = causal_conv1d_update(x, want_state, w, b, "silu", start)

    def step(x, state):
        return causal_conv1d_update(x, state, w, b, "silu", start)

    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="eager" if backend.name == "emu" else "inductor")(x, state)
    assert torch.equal(got, want) and torch.equal(state, want_state)


@pytest.mark.parametrize("circular", [False, True])
def test_update_reads_strided_and_expanded_index_tensors(backend, circular):
    """Index tensors are read by value whatever their strides: stepped slices of cache_seqlens and
    conv_state_indices, and an expanded padding index (each would be misread if taken densely)."""
    dev = backend.device
    g = torch.Generator().manual_seed(17)
    x, big, w, b = _case(dev, 2, 8, 4, 1, 4, entries=6, gen=g)
    start = torch.tensor([3, 99, 6, 99], dtype=torch.int32, device=dev)[::2] if circular else None
    dense_start = None if start is None else start.contiguous()
    for indices in (
        torch.tensor([4, 9, 1, 9], dtype=torch.int32, device=dev)[::2],
        torch.tensor([-1], dtype=torch.int32, device=dev).expand(2),
    ):
        want_big = big.clone()
        want = causal_conv1d_update(x, want_big, w, b, "silu", dense_start, indices.contiguous())
        got = causal_conv1d_update(x, big, w, b, "silu", start, indices)
        assert torch.equal(got, want) and torch.equal(big, want_big)


def test_update_bumps_the_states_version_counter(backend):
    """The step writes conv_state in place: autograd sees it (a graph that saved the state raises)."""
    x, state, w, b = _case(backend.device, 2, 8, 4, 1, 3)
    before = state._version
    causal_conv1d_update(x, state, w, b, "silu")
    assert state._version > before


def test_update_refuses_a_16_bit_weight_with_float64_x():
    x, state, w, b = _case("cpu", 2, 8, 4, 1, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="weight: expected float64 with float64 x"):
        causal_conv1d_update(x, state, w.to(torch.bfloat16), None)
