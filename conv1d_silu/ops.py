"""Implementations and ``torch.library`` custom ops.

``forward_impl`` / ``backward_impl`` pick a program (forced, or by the route table for CUDA
tensors; the PyTorch reference on the CPU) and run it. The custom ops wrap them for the
dispatcher: real kernels for every device, fake kernels (shape arithmetic only) for
torch.compile, and autograd on the forward op (see autograd.py).

Ops (namespace ``conv1d_silu``):

* ``fwd``            -> (y, final_states)            final_states is (0, K-1, C) when not asked for
* ``bwd``            -> (dx, dweight, dbias, dinitial) absent ones are empty tensors
* ``bwd_main_grad``  -> (dx, dinitial), adding dweight/dbias into fp32 buffers (mutates them)
* ``update``         -> out, the decoding step, appending the new tokens to conv_state (mutates it)
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
from torch import Tensor

from . import config, decoding, gpu, gpu_bcl, reference, routes
from .documents import DocTable, doc_table, num_documents
from .runtime import device_index, overlaps
from .states import add_final_state_grads
from .validation import channel_first, row_stride

Tensor_ = Optional[Tensor]


_launcher: gpu.Launcher = gpu.CUDA
_emulated_arch: str | None = None  # set while the kernel tests run the CUDA path on CPU tensors

# Call signature -> the checked and routed eager call (api.py), so that a repeated call does no
# checking, routing or planning beyond a dictionary lookup. Routes and plans depend on the launcher
# (its SM count and residency) and the emulated arch, so changing either empties it.
EAGER_CALLS: dict[tuple, object] = {}
MAX_EAGER_CALLS = 4096  # a workload of ever new shapes starts over rather than growing without bound


def remember(key: tuple, call: object) -> None:
    """Keep ``call`` for its signature ``key`` in :data:`EAGER_CALLS`."""
    if len(EAGER_CALLS) >= MAX_EAGER_CALLS:
        EAGER_CALLS.clear()
    EAGER_CALLS[key] = call


def launcher() -> gpu.Launcher:
    """Where the kernels' launches go now (:func:`use_launcher`)."""
    return _launcher


@contextlib.contextmanager
def use_launcher(launcher: gpu.Launcher, emulate_arch: str | None = None):
    """Send kernel launches to ``launcher``; with ``emulate_arch``, CPU tensors take the CUDA path
    as if on that arch (the tests' CPU emulator of the kernels)."""
    global _launcher, _emulated_arch
    saved = _launcher, _emulated_arch
    _launcher, _emulated_arch = launcher, emulate_arch
    EAGER_CALLS.clear()
    try:
        yield
    finally:
        _launcher, _emulated_arch = saved
        EAGER_CALLS.clear()


def _arch(device: torch.device) -> str:
    if device.type != "cuda":
        return _emulated_arch
    return _cuda_arch(device_index(device))


MIN_CAPABILITY = (8, 0)  # the kernels' row pipeline is cp.async, an sm_80 instruction


@functools.lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    capability = torch.cuda.get_device_capability(index)
    if capability < MIN_CAPABILITY:
        raise RuntimeError(
            f"conv1d_silu: the CUDA kernels need compute capability 8.0 or newer (cp.async); GPU {index} is "
            f"{capability[0]}.{capability[1]}. program='reference' runs the PyTorch reference on it."
        )
    return routes.arch_of(capability)


ROUTED = ""  # a program argument that means: the route table, CONV1D_SILU_PROGRAM already read


def choose(
    direction: str,
    x: Tensor,
    weight: Tensor,
    has_bias: bool,
    doc: DocTable,
    fp32_grads: bool,
    program: str | None,
) -> routes.Program:
    """The program for this call: forced by argument or ``CONV1D_SILU_PROGRAM``, else routed.
    ``program`` None reads the environment; :data:`ROUTED` (or a name) does not."""
    kernels = x.is_cuda or _emulated_arch is not None
    forced = routes.forced(config.forced_program() if program is None else program or None, direction, kernels)
    if forced is not None:
        return forced
    if not kernels:
        return routes.PROGRAMS["reference"]
    variant = routes.variant_name(direction, has_bias, doc.table is not None, fp32_grads)
    C, K = weight.shape
    layout = "BCL" if channel_first(x) else "BLC"
    return routes.select(_arch(x.device), variant, C, doc.S, K, routes.dtype_name(x.dtype), layout)


class Route:
    """The programs of one call signature (shapes, strides, dtypes, flags, device, program), x's row
    stride (None: x is channel-first), and the launches planned for them, filled in by the first call
    of each alignment class of the data pointers (and, backward, each row stride of dy); see
    gpu.forward; ``plain``: the signature's calls as :class:`gpu.Plain`, where they are."""

    __slots__ = ("fwd", "bwd", "x_stride", "fwd_plans", "bwd_plans", "plain")

    def __init__(self, fwd: routes.Program | None, bwd: routes.Program | None, x_stride: int):
        self.fwd, self.bwd, self.x_stride = fwd, bwd, x_stride
        self.fwd_plans: dict = {}
        self.bwd_plans: dict = {}
        self.plain: gpu.Plain | None = None


def _fp32_grads(grad_dtype: torch.dtype, weight: Tensor, main_grad: bool) -> bool:
    """Whether the backward sums the weight gradients in fp32 (a variant of its own)."""
    return grad_dtype == torch.float32 and weight.dtype != torch.float32 or main_grad


def route(
    x: Tensor, weight: Tensor, bias: Tensor | None, doc: DocTable, grad_dtype: torch.dtype, main_grad: bool,
    program: str | None, silu: bool = True, plain: bool = False,
) -> Route:
    """Both directions' programs for a call (``program``: see :func:`choose`); ``plain``: the call
    has no states and no main_grad buffers, so it may take :class:`gpu.Plain`."""
    has_bias = bias is not None
    fwd = choose("fwd", x, weight, has_bias, doc, False, program)
    bwd = choose("bwd", x, weight, has_bias, doc, _fp32_grads(grad_dtype, weight, main_grad), program)
    r = Route(fwd, bwd, row_stride(x))
    if plain and gpu.Plain.applies(x, weight, bias, doc, grad_dtype, fwd, bwd, r.x_stride):
        r.plain = gpu.Plain(fwd, bwd, x, r.x_stride, doc, silu, grad_dtype, _launcher, r.fwd_plans, r.bwd_plans)
    return r


def like_x(x: Tensor) -> Tensor:
    """An output of x's shape in x's layout: channel-first memory for channel-first x (as
    causal-conv1d's ``torch.empty_like``), else contiguous. The fake kernels give the same."""
    return gpu_bcl.like_x(x) if channel_first(x) else gpu.fresh_like(x)


def _channel_first_copy(t: Tensor) -> Tensor:
    """A (S, C) or (B, L, C) tensor copied to channel-first memory, as a (B, L, C) view."""
    t3 = t if t.dim() == 3 else t.unsqueeze(0)
    return t3.new_empty((t3.shape[0], t3.shape[2], t3.shape[1])).transpose(1, 2).copy_(t3)


def forward_impl(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    doc: DocTable,
    initial_states: Tensor | None,
    return_final_states: bool,
    silu: bool,
    program: str | None,
    route: Route | None = None,
) -> tuple[Tensor, Tensor | None]:
    """y (x's layout, :func:`like_x`) and the final states; ``route``: the call signature's programs
    and plans (eager calls), else the program is chosen now by ``program``. A program of the other
    layout than x's (forced, or the reference for channel-first x) runs on a copy of x in its own."""
    if route is None:
        route = Route(choose("fwd", x, weight, bias is not None, doc, False, program), None, row_stride(x))
    prog, cf = route.fwd, route.x_stride is None and channel_first(x)
    if prog.cuda and prog.layout == "BCL":
        y, final = gpu_bcl.forward(
            x if cf else _channel_first_copy(x), weight, bias, doc, initial_states, return_final_states, silu,
            _launcher,
        )
        return (y if cf else y.contiguous().view(x.shape)), final
    if route.x_stride is None:  # channel-first x (or strides no kernel reads) on a token-major copy
        y, final = forward_impl(
            x.contiguous(), weight, bias, doc, initial_states, return_final_states, silu, None,
            Route(prog, None, x.shape[-1]),
        )
        return like_x(x).copy_(y), final
    if not route.fwd.cuda:
        return reference.forward(x, weight, bias, doc, initial_states, return_final_states, silu)
    return gpu.forward(
        x, weight, bias, doc, initial_states, return_final_states, silu, route.fwd, route.x_stride, _launcher,
        route.fwd_plans,
    )


def backward_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    doc: DocTable,
    initial_states: Tensor | None,
    dfinal: Tensor | None,
    silu: bool,
    grad_dtype: torch.dtype,
    program: str | None,
    weight_grad_out: Tensor | None = None,
    bias_grad_out: Tensor | None = None,
    trailing: tuple[Tensor, Tensor] | None = None,
    route: Route | None = None,
    keep_scratch: bool = True,
    dx_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """dx (x's layout), dweight (C, K), dbias, dinitial; with ``weight_grad_out`` the weight/bias
    grads are added into the given fp32 buffers instead. ``trailing``: see gpu.backward. ``route``: as
    for :func:`forward_impl`. ``keep_scratch``: see gpu.backward_scratch. ``dx_out``: a tensor of x's
    shape that receives dx (the channel-first kernels write it in place where it overlaps no input)."""
    if route is None:
        fp32_grads = _fp32_grads(grad_dtype, weight, weight_grad_out is not None)
        route = Route(None, choose("bwd", x, weight, bias is not None, doc, fp32_grads, program), row_stride(x))
    elif route.x_stride is not None and (x_stride := row_stride(x)) != route.x_stride:
        # a saved-tensor hook (save_on_cpu, offloading) can hand x back with other strides than the
        # forward's: the signature's plans read rows route.x_stride apart
        route = Route(None, route.bwd, x_stride)
    prog = route.bwd
    if prog.layout == "BCL" and trailing is not None and trailing[0].shape[0] > 0:
        raise ValueError(
            f"program: {prog.name!r} takes no trailing tokens (context parallelism); force a channel-last program"
        )
    if route.x_stride is None or prog.layout == "BCL":
        dx, dw, db, dinit = _backward_across_layouts(
            dy, x, weight, bias, doc, initial_states, dfinal, silu, grad_dtype, weight_grad_out, bias_grad_out,
            prog, keep_scratch, dx_out,
        )
    elif not prog.cuda:
        dx, dw, db, dinit = _backward_reference(
            dy, x, weight, bias, doc, initial_states, dfinal, silu, grad_dtype, weight_grad_out, bias_grad_out,
            trailing,
        )
    else:  # the channel-last kernels: the eager hot path, inline (a layer of its own cost a call per backward)
        # read in place where the kernels can (one row repeated too); a channel stride of 0 (the
        # expanded scalar that y.sum() hands back) needs a copy: the kernels read rows as vectors
        dy_rs = row_stride(dy, repeated=True)
        if dy_rs is None:
            dy, dy_rs = dy.contiguous(), dy.shape[-1]
        dx, dw, db, dinit = gpu.backward(
            dy, dy_rs, x, route.x_stride, weight, bias, doc, initial_states, silu, grad_dtype, prog,
            weight_grad_out, bias_grad_out, _launcher, trailing, route.bwd_plans, keep_scratch,
        )
        if dfinal is not None:
            add_final_state_grads(dx, dinit, dfinal, doc, weight.shape[1])
    if dx_out is not None and dx is not dx_out:
        dx = dx_out.copy_(dx)
    return dx, dw, db, dinit


def _backward_across_layouts(
    dy, x, weight, bias, doc, initial_states, dfinal, silu, grad_dtype, weight_grad_out, bias_grad_out, prog,
    keep_scratch, dx_out,
):
    """The backward of channel-first x, or of a channel-first program forced on channel-last x: the
    channel-first kernels in place, anything else on token-major copies (dx back in x's layout)."""
    cf = channel_first(x)
    if not (prog.cuda and prog.layout == "BCL"):  # the reference or a channel-last program
        dx, dw, db, dinit = backward_impl(
            dy.contiguous(), x.contiguous(), weight, bias, doc, initial_states, dfinal, silu, grad_dtype, None,
            weight_grad_out, bias_grad_out, route=Route(None, prog, x.shape[-1]), keep_scratch=keep_scratch,
        )
        return like_x(x).copy_(dx), dw, db, dinit
    xf = x if cf else _channel_first_copy(x)
    # dy in place where its sequence is contiguous; else (channel-last, expanded) copied like x
    dyf = dy if cf and dy.stride(1) == 1 else _channel_first_copy(dy)
    into = dx_out if cf and dx_out is not None and dx_out.stride(1) == 1 else None
    if into is not None and any(overlaps(into, t) for t in (x, dy, initial_states) if t is not None):
        into = None  # computed in storage of its own, then copied
    dx, dw, db, dinit = gpu_bcl.backward(
        dyf, xf, weight, bias, doc, initial_states, silu, grad_dtype, weight_grad_out, bias_grad_out, _launcher,
        into, keep_scratch, prog.chain,
    )
    if dfinal is not None:
        add_final_state_grads(dx, dinit, dfinal, doc, weight.shape[1])
    return (dx if cf else dx.contiguous().view(x.shape)), dw, db, dinit


def _backward_reference(
    dy, x, weight, bias, doc, initial_states, dfinal, silu, grad_dtype, weight_grad_out, bias_grad_out, trailing,
):
    out_dtype = torch.float32 if weight_grad_out is not None else grad_dtype
    dx, dw, db, dinit = reference.backward(dy, x, weight, bias, doc, initial_states, dfinal, silu, out_dtype, trailing)
    if weight_grad_out is not None:
        weight_grad_out.add_(dw)
        if bias_grad_out is not None:
            bias_grad_out.add_(db)
        dw, db = weight_grad_out, bias_grad_out
    return dx, dw, db, dinit


# ---- custom ops ---------------------------------------------------------------------------
# An op's schema has fixed outputs, so an absent output is an empty placeholder: final states and
# their gradient (0, K-1, C), dbias (0,).


def _states_like(x: Tensor, weight: Tensor, n: int = 0) -> Tensor:
    C, K = weight.shape
    return x.new_empty((n, K - 1, C))


def _bias_grad_like(weight: Tensor, bias: Tensor_, grad_dtype: torch.dtype) -> Tensor:
    return weight.new_empty((0 if bias is None else weight.shape[0],), dtype=grad_dtype)


@torch.library.custom_op("conv1d_silu::fwd", mutates_args=())
def fwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor_,
    seq_idx: Tensor_,
    cu_seqlens: Tensor_,
    initial_states: Tensor_,
    weight_main_grad: Tensor_,
    bias_main_grad: Tensor_,
    return_final_states: bool,
    silu: bool,
    fp32_grads: bool,
    program: Optional[str],
) -> tuple[Tensor, Tensor]:
    """Forward: y = act(conv(x)) and the final states (empty when not asked for).

    ``weight_main_grad`` / ``bias_main_grad`` / ``fp32_grads`` are not read here: they tell the
    registered backward where and how to put the weight gradients."""
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    y, final = forward_impl(x, weight, bias, doc, initial_states, return_final_states, silu, program)
    return y, _states_like(x, weight) if final is None else final


@fwd.register_fake
def _fwd_fake(
    x, weight, bias, seq_idx, cu_seqlens, initial_states, wmg, bmg, return_final_states, silu, fp32_grads, program
):
    n = num_documents(x, seq_idx, cu_seqlens, initial_states) if return_final_states else 0
    return like_x(x), _states_like(x, weight, 0 if n is None else n)


def _dinit_like(x: Tensor, weight: Tensor, initial_states: Tensor_) -> Tensor:
    return _states_like(x, weight) if initial_states is None else x.new_empty(initial_states.shape)


@torch.library.custom_op("conv1d_silu::bwd", mutates_args=())
def bwd(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor_,
    seq_idx: Tensor_,
    cu_seqlens: Tensor_,
    initial_states: Tensor_,
    dfinal: Tensor_,
    silu: bool,
    fp32_grads: bool,
    program: Optional[str],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Backward: dx, dweight (C, K), dbias ((0,) without bias), dinitial ((0, K-1, C) without)."""
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    grad_dtype = torch.float32 if fp32_grads else weight.dtype
    # nothing kept between calls: torch.compile may run this op in a CUDA graph's memory pool
    dx, dw, db, dinit = backward_impl(
        dy, x, weight, bias, doc, initial_states, dfinal, silu, grad_dtype, program, keep_scratch=False
    )
    db = _bias_grad_like(weight, None, grad_dtype) if db is None else db
    return dx, dw, db, _states_like(x, weight) if dinit is None else dinit


@bwd.register_fake
def _bwd_fake(dy, x, weight, bias, seq_idx, cu_seqlens, initial_states, dfinal, silu, fp32_grads, program):
    grad_dtype = torch.float32 if fp32_grads else weight.dtype
    dw = weight.new_empty(weight.shape, dtype=grad_dtype)
    return like_x(x), dw, _bias_grad_like(weight, bias, grad_dtype), _dinit_like(x, weight, initial_states)


@torch.library.custom_op("conv1d_silu::bwd_main_grad", mutates_args=("weight_main_grad", "bias_main_grad"))
def bwd_main_grad(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor_,
    seq_idx: Tensor_,
    cu_seqlens: Tensor_,
    initial_states: Tensor_,
    dfinal: Tensor_,
    weight_main_grad: Tensor,
    bias_main_grad: Tensor_,
    silu: bool,
    program: Optional[str],
) -> tuple[Tensor, Tensor]:
    """Backward that adds dweight/dbias (fp32) into ``weight_main_grad`` (C, K) / ``bias_main_grad``."""
    doc = doc_table(x, seq_idx, cu_seqlens, initial_states)
    dx, _, _, dinit = backward_impl(
        dy, x, weight, bias, doc, initial_states, dfinal, silu, torch.float32, program,
        weight_main_grad, bias_main_grad, keep_scratch=False,
    )
    return dx, _states_like(x, weight) if dinit is None else dinit


@bwd_main_grad.register_fake
def _bwd_main_grad_fake(dy, x, weight, bias, seq_idx, cu_seqlens, initial_states, dfinal, wmg, bmg, silu, program):
    return like_x(x), _dinit_like(x, weight, initial_states)


# ---- the decoding step ----------------------------------------------------------------------


def step_kernel(x: Tensor) -> bool:
    """Whether a decoding step on ``x`` runs the CUDA kernel (or its emulator)."""
    return (x.is_cuda or _emulated_arch is not None) and config.forced_program() != "reference"


def update_impl(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor_, silu: bool, cache_seqlens: Tensor_,
    conv_state_indices: Tensor_,
) -> Tensor:
    """The decoding step: one kernel launch for CUDA tensors, plain PyTorch on the CPU (and with
    ``CONV1D_SILU_PROGRAM=reference``)."""
    if step_kernel(x):
        if x.is_cuda:
            _cuda_arch(device_index(x.device))  # refuses GPUs below sm_80
        out = gpu.update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, _launcher)
        # the kernel writes the state behind autograd's back: a graph that saved it must see the change
        torch.autograd.graph.increment_version(conv_state)
        return out
    return decoding.update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)


@torch.library.custom_op("conv1d_silu::update", mutates_args=("conv_state",))
def update_op(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor_, silu: bool, cache_seqlens: Tensor_,
    conv_state_indices: Tensor_,
) -> Tensor:
    """The decoding step as an op: out ``(B, C, L)``; conv_state is updated in place."""
    return update_impl(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)


@update_op.register_fake
def _update_fake(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices):
    return torch.empty_like(x)


def update(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices) -> Tensor:
    """The decoding step: straight to the launch in eager mode (the dispatcher's round trip would
    cost more host time than the step's kernel), the custom op while compiling."""
    run = update_op if torch.compiler.is_compiling() else update_impl
    return run(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices)
