"""Every argument through every layout and entry point, against the reference.

Entry points: the function ``causal_conv1d_silu(..., layout=)``, the module ``CausalConv1dSiLU``
and ``conv1d_silu.compat.causal_conv1d_fn``. Forms of x: packed tokens ``(S, C)`` and a batch
``(B, L, C)`` (``"BLC"``), and ``(B, C, L)`` (``"BCL"``) in channel-last and in channel-first
memory; a 3-D form with cu_seqlens is one packed row, ``(1, S, C)`` / ``(1, C, S)``. x is a slice
of a wider tensor, as a projection's output is. Arguments: seq_idx, cu_seqlens, initial_states,
return_final_states, activation, the gradients' dtype (fp32 master weights, ``grad_dtype``),
main_grad accumulation and a forced program. Each case checks y, the final states, dx, dweight,
dbias and dinitial against per-document float64 ``F.conv1d`` on the token-major inputs (gradients
by float64 autograd of it), and that the program reached the op; an argument that an entry point or
a layout cannot take must raise, naming it, instead of being ignored.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
from conftest import DEVICES
from helpers import assert_close, doc_spans, naive

from conv1d_silu import CausalConv1dSiLU, causal_conv1d_silu, ops
from conv1d_silu.compat import causal_conv1d_fn

C, K, B, L = 8, 4, 2, 13
S = B * L
PAD = 3  # x = x_wide[..., :C] (channel-first: x_wide[:, :C]): strides beyond the dense ones
CU_SEQLENS = [0, 2, 2, 9, S]  # documents of 2 (shorter than K-1), 0, 7 and 17 tokens
SEQ_IDX = [0] * 2 + [1] * 7 + [3] * 17  # id 2 unused: an empty document; 4 documents
SEQ_IDX_ROWS = [[0] * 5 + [1] * 8, [0] * L]  # 3-D x: one row per batch row
MAIN_GRAD_START = 0.5, -0.25  # main_grad buffers hold earlier gradients: the backward adds to them

ENTRIES = ("function", "module", "compat")
FORMS = ("tokens", "batch", "bcl_channel_last", "bcl_channel_first")
DOCS = ("none", "seq_idx", "cu_seqlens")
STATES = ("none", "initial", "final", "both")
# "weight": gradients in the weight's dtype; "fp32_master": bf16 x and fp32 weight; "grad_dtype":
# bf16 x and weight, grad_dtype=torch.float32; "main_grad": gradients added into fp32 main_grad buffers
GRADS = ("weight", "fp32_master", "grad_dtype", "main_grad")


@dataclass(frozen=True)
class Case:
    entry: str
    form: str
    docs: str
    states: str
    activation: str | None
    grads: str

    @property
    def bcl(self) -> bool:
        return self.form.startswith("bcl")

    @property
    def packed_row(self) -> bool:
        return self.docs == "cu_seqlens" and self.form != "tokens"

    @property
    def initial(self) -> bool:
        return self.states in ("initial", "both")

    @property
    def final(self) -> bool:
        return self.states in ("final", "both")

    @property
    def dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """x's and the weight's."""
        bf16, fp32 = torch.bfloat16, torch.float32
        return {"fp32_master": (bf16, fp32), "grad_dtype": (bf16, bf16)}.get(self.grads, (fp32, fp32))

    def refusal(self) -> tuple[type[Exception], str] | None:
        """The error that names the argument this entry point or layout cannot take, if any."""
        if self.entry == "compat" and self.docs == "cu_seqlens":
            return TypeError, "cu_seqlens"
        if self.entry == "compat" and self.grads == "main_grad":
            return TypeError, "weight_main_grad"
        if self.entry != "function" and self.grads == "grad_dtype":
            return TypeError, "grad_dtype"
        if self.grads == "grad_dtype":  # 16-bit weights: autograd would round fp32 gradients back
            return ValueError, "grad_dtype"
        if self.entry == "compat" and self.docs == "seq_idx" and self.final:
            # causal-conv1d returns no final states with seq_idx
            return ValueError, "return_final_states: expected None"
        if self.docs == "seq_idx" and self.final and not self.initial:
            return ValueError, "return_final_states: expected initial_states"
        if self.docs == "seq_idx" and self.form != "tokens" and self.final:
            # 3-D x: the states are one per batch row, for the row's first document
            return ValueError, "return_final_states: expected False with 3-D x"
        return None

    @property
    def row_states(self) -> bool:
        """seq_idx on 3-D x with initial states: row b's state feeds only the row's first document."""
        return self.docs == "seq_idx" and self.form != "tokens" and self.initial


CASES = [
    pytest.param(Case(*values), id="-".join(str(v) for v in values))
    for values in itertools.product(ENTRIES, FORMS, DOCS, STATES, ("silu", None), GRADS)
    if values[0] != "compat" or values[1].startswith("bcl")  # causal-conv1d's x is (batch, dim, seqlen)
]


def _programs(device: str) -> list[str]:
    """``reference`` everywhere; on CUDA also a forced forward and a forced backward program."""
    return ["reference"] + (["fwd_rows", "rowgroup"] if device == "cuda" else [])


def _inputs(case: Case, device: str):
    """The case's token-major float64 tensors (the reference's), its document table, and x, the
    weight, the bias and the initial states in the entry point's form, with gradients on."""
    gen = torch.Generator().manual_seed(FORMS.index(case.form))
    dtype, wdtype = case.dtypes

    def rnd(*shape, dt=dtype):  # values exact in dt: the float64 reference sees the same numbers
        return torch.randn(*shape, generator=gen).to(dt).double()

    rows, length = (1, S) if case.form == "tokens" or case.packed_row else (B, L)
    n_docs = {"cu_seqlens": len(CU_SEQLENS) - 1, "seq_idx": max(SEQ_IDX) + 1}.get(case.docs, rows)
    if case.row_states:
        n_docs = rows
    ref = {"x": rnd(rows, length, C), "weight": rnd(C, K, dt=wdtype), "bias": rnd(C, dt=wdtype)}
    if case.form == "tokens" or case.packed_row:
        ref["x"] = ref["x"][0]  # the reference runs packed tokens (S, C)
    ref["initial_states"] = rnd(n_docs, K - 1, C) if case.initial else None
    ref["dy"], ref["dfinal"] = rnd(*ref["x"].shape), rnd(n_docs, K - 1, C)
    docs = {}
    if case.docs == "cu_seqlens":
        docs["cu_seqlens"] = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device)
    elif case.docs == "seq_idx":
        ids = SEQ_IDX if case.form == "tokens" else SEQ_IDX_ROWS
        docs["seq_idx"] = torch.tensor(ids, dtype=torch.int32, device=device)

    tokens = ref["x"].reshape(rows, length, C).to(device, dtype)
    if case.form == "bcl_channel_first":  # mamba_ssm's chunk of a wider (B, 2D, L) tensor
        x = torch.zeros(rows, C + PAD, length, dtype=dtype, device=device)[:, :C]
        x.copy_(tokens.transpose(1, 2))
    else:  # a split of a wider projection (B, L, proj)
        x = torch.zeros(rows, length, C + PAD, dtype=dtype, device=device)[..., :C]
        x.copy_(tokens)
        x = {"tokens": x[0], "batch": x, "bcl_channel_last": x.transpose(1, 2)}[case.form]
    init = ref["initial_states"]
    if init is not None:
        init = init.to(device, dtype)
        init = init.transpose(1, 2) if case.bcl else init  # causal-conv1d's (N, C, K-1)
        init.requires_grad_()
    weight = ref["weight"].to(device, wdtype).requires_grad_()
    bias = ref["bias"].to(device, wdtype).requires_grad_()
    return ref, docs, x.requires_grad_(), weight, bias, init


def _tokens(t: torch.Tensor, case: Case, states: bool = False) -> torch.Tensor:
    """An entry point's x-shaped tensor (or states) in the reference's token-major form."""
    t = t.transpose(1, 2) if case.bcl else t
    return t[0] if case.packed_row and not states else t


def _reference(ref: dict, docs: dict, case: Case) -> dict:
    """The independent oracle: per document, float64 F.conv1d over the initial state (or zeros)
    and the document's tokens (tests/helpers.py naive), and float64 autograd's gradients of it."""
    names = ("x", "weight", "bias") + (("initial_states",) if case.initial else ())
    leaves = {k: ref[k].clone().requires_grad_() for k in names}
    x = leaves["x"]
    S = x.numel() // C
    table = {k: v.cpu() for k, v in docs.items()}
    row_len = x.shape[1] if x.dim() == 3 else None
    spans = doc_spans(S, seq_idx=table.get("seq_idx"), cu_seqlens=table.get("cu_seqlens"), batch_len=row_len,
                      n_docs=ref["dfinal"].shape[0] if "seq_idx" in table and not case.row_states else None)
    if case.row_states:  # the row's first document reads the row's state, the others none
        spans = [(s, e, s // row_len if s % row_len == 0 else -1) for s, e, _ in spans]
    y, finals = naive(x.reshape(S, C), leaves["weight"], leaves["bias"], spans, leaves.get("initial_states"),
                      case.activation is not None)
    y = y.reshape(x.shape)
    final = torch.stack([finals[d] for d in range(ref["dfinal"].shape[0])]) if case.final else None
    loss = (y * ref["dy"]).sum() + ((final * ref["dfinal"]).sum() if case.final else 0)
    grads = dict(zip(names, torch.autograd.grad(loss, list(leaves.values()))))
    return {"y": y, "final": final, "dx": grads["x"], "dweight": grads["weight"], "dbias": grads["bias"],
            "dinit": grads.get("initial_states")}


def _call(case: Case, x, weight, bias, init, docs: dict, program: str):
    """The entry point with every argument of the case, passed its own way (one it has no way to
    take goes in as a keyword). Returns (y, final states, the parameters, main_grad buffers)."""
    layout = "BCL" if case.bcl else "BLC"
    kw = dict(docs, initial_states=init, return_final_states=case.final)
    if case.grads == "grad_dtype":
        kw["grad_dtype"] = torch.float32
    main = None
    if case.grads == "main_grad":
        main = tuple(torch.full(shape, v, device=x.device) for shape, v in zip(((C, K), (C,)), MAIN_GRAD_START))
    if case.entry == "function":
        wmg, bmg = main or (None, None)
        out = causal_conv1d_silu(
            x, weight, bias, activation=case.activation, layout=layout, program=program,
            weight_main_grad=wmg, bias_main_grad=bmg, **kw,
        )
        params = weight, bias
    elif case.entry == "module":
        m = CausalConv1dSiLU(C, K, activation=case.activation, layout=layout, program=program,
                             accumulate_into_main_grad=main is not None, device=x.device, dtype=weight.dtype)
        with torch.no_grad():
            m.weight.copy_(weight.view(C, 1, K))
            m.bias.copy_(bias)
        if main is not None:
            m.weight.main_grad, m.bias.main_grad = main[0].view(C, 1, K), main[1]
        out = m(x, **kw)
        params = m.weight, m.bias
    else:
        with pytest.raises(TypeError, match="program"):
            causal_conv1d_fn(x, weight, bias, program=program)
        if main is not None:
            kw["weight_main_grad"], kw["bias_main_grad"] = main
        out = causal_conv1d_fn(x, weight, bias, activation=case.activation, **kw)
        params = weight, bias
    y, final = out if case.final else (out, None)
    return y, final, params, main


def _program_choices(monkeypatch) -> list[tuple[str, str]]:
    """From now on, the (direction, program argument) of each program choice of the op."""
    seen, choose = [], ops.choose

    def spy(direction, *args):
        seen.append((direction, args[-1]))
        return choose(direction, *args)

    monkeypatch.setattr(ops, "choose", spy)
    return seen


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_every_argument_in_every_layout(device, case, monkeypatch):
    for program in _programs(device):
        ref, docs, x, weight, bias, init = _inputs(case, device)
        refusal = case.refusal()
        if refusal is not None:
            with pytest.raises(refusal[0], match=refusal[1]):
                _call(case, x, weight, bias, init, docs, program)
            continue

        seen = _program_choices(monkeypatch)
        y, final, (w, b), main = _call(case, x, weight, bias, init, docs, program)
        assert y.shape == x.shape and y.dtype == x.dtype
        if case.bcl:
            assert (y.stride(1) == 1) == (x.stride(1) == 1), "y keeps x's memory layout"
        y_tokens = _tokens(y, case)
        loss = (y_tokens.double() * ref["dy"].to(device)).sum()
        if case.final:
            final = _tokens(final, case, states=True)
            loss = loss + (final.double() * ref["dfinal"].to(device)).sum()
        loss.backward()
        monkeypatch.undo()
        if case.entry != "compat":
            assert {d for d, _ in seen} == {"fwd", "bwd"} and {p for _, p in seen} == {program}, seen

        want = _reference(ref, docs, case)
        assert_close(y_tokens, want["y"], name="y")
        if case.final:
            assert_close(final, want["final"], name="final_states")
        assert_close(_tokens(x.grad, case), want["dx"], name="dx")
        if case.initial:
            assert_close(_tokens(init.grad, case, states=True), want["dinit"], name="dinitial_states")
        if main is not None:
            assert w.grad is None and b.grad is None, "main_grad accumulation leaves .grad alone"
            dw, db = (buf - start for buf, start in zip(main, MAIN_GRAD_START))
        else:  # autograd hands .grad over in the weight's dtype
            dw, db = w.grad.view(C, K), b.grad
            assert dw.dtype == db.dtype == w.dtype
        assert_close(dw, want["dweight"], name="dweight")
        assert_close(db, want["dbias"], name="dbias")


def test_grad_dtype_is_not_silently_ignored():
    x = torch.randn(20, C, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(C, K, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="grad_dtype"):
        causal_conv1d_silu(x, w, grad_dtype=torch.float32)
