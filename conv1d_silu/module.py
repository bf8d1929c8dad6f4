"""``CausalConv1dSiLU``: the short convolution of Mamba-style blocks as an nn.Module."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import ops
from .api import causal_conv1d_silu
from .layout import LAYOUTS
from .routes import PROGRAMS
from .validation import activation_flag, check_weight_for, fail


class CausalConv1dSiLU(nn.Module):
    """Causal depthwise conv1d + SiLU over ``(B, L, C)`` or packed ``(S, C)`` tokens.

    Parameters are those of ``nn.Conv1d(C, C, K, groups=C, bias=bias)`` (weight ``(C, 1, K)``),
    so state dicts load in both directions; the initialisation matches nn.Conv1d's too. The module
    also answers to nn.Conv1d's attributes, read-only: ``in_channels`` and ``out_channels`` and
    ``groups`` (C), ``kernel_size`` ``(K,)``, ``padding`` ``(K-1,)`` (the left padding that makes
    it causal: the output is nn.Conv1d's first L positions), ``stride`` and ``dilation`` ``(1,)``,
    ``padding_mode`` ``"zeros"``; so code that reads a conv's shape keeps working.

    Decoding (like flash-linear-attention's ``ShortConvolution``): a prefill
    ``y, cache = m(x, return_final_states=True)`` (or ``cache = m.new_cache(B)``), then
    ``y_t = m.step(x_t, cache)`` per token, which updates ``cache`` in place.

    Args:
        channels: C.
        kernel_size: K, 2..8.
        bias: learn a bias.
        activation: ``"silu"`` or None.
        layout: ``"BLC"`` (default): inputs ``(B, L, C)`` or packed ``(S, C)``, channels contiguous,
            read in place (strided slices too). ``"BCL"``: inputs ``(B, C, L)`` like nn.Conv1d; a
            channel-last tensor (``x.stride(1) == 1``, e.g. ``h.transpose(1, 2)``) is still read in
            place, a channel-first one costs a copy in and one out (output in the input's layout).
        accumulate_into_main_grad: add the weight/bias gradients in place into the fp32
            ``main_grad`` buffers that the weight (and bias) carry (Megatron) instead of ``.grad``;
            a forward that will need gradients raises if the weight has none.
        program: force a kernel program (tests, benchmarks).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 4,
        bias: bool = True,
        activation: str | None = "silu",
        *,
        layout: str = "BLC",
        accumulate_into_main_grad: bool = False,
        program: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels: expected a positive int, got {channels!r}")
        if not isinstance(kernel_size, int) or not 2 <= kernel_size <= 8:
            raise ValueError(f"kernel_size: expected an int in [2, 8], got {kernel_size!r}")
        activation_flag(activation)
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected 'BLC' or 'BCL', got {layout!r}")
        if program is not None and program not in PROGRAMS:
            raise ValueError(f"program: expected one of {sorted(PROGRAMS)}, got {program!r}")
        self.layout = layout
        factory = {"device": device, "dtype": dtype}
        self._channels, self._width, self.activation = channels, kernel_size, activation
        self.accumulate_into_main_grad, self.program = accumulate_into_main_grad, program
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(channels, **factory)) if bias else None
        self.reset_parameters()

    # nn.Conv1d's attributes, derived from (C, K): setting one would not change the op.
    channels = in_channels = out_channels = groups = property(lambda self: self._channels)
    kernel_size = property(lambda self: (self._width,))
    padding = property(lambda self: (self._width - 1,))
    stride = dilation = property(lambda self: (1,))
    padding_mode = property(lambda self: "zeros")

    def reset_parameters(self) -> None:
        """nn.Conv1d's initialisation (fan_in = K for a depthwise filter)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self._width)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self,
        x: torch.Tensor,
        *,
        seq_idx: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        return_final_states: bool = False,
    ):
        """y (and the final states) of ``x`` in the module's layout; states are ``(N, K-1, C)``
        with ``"BLC"`` and ``(N, C, K-1)`` with ``"BCL"``."""
        return self._op(
            x, self.layout, seq_idx=seq_idx, cu_seqlens=cu_seqlens, initial_states=initial_states,
            return_final_states=return_final_states,
        )

    def _op(self, x: torch.Tensor, layout: str, **kwargs):
        """The op with this module's parameters, activation, program and main_grad buffers."""
        axis = -1 if layout == "BLC" else -2
        if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[axis] != self.weight.shape[0]:
            # named here, not as the op's weight mismatch: the module's channels are the given ones
            raise ValueError(
                f"x: expected {self.weight.shape[0]} channels (the module's) in x.shape[{axis}] for layout "
                f"{layout!r}, got {x.shape[axis]}"
            )
        wmg = bmg = None
        if self.accumulate_into_main_grad and torch.is_grad_enabled() and self.weight.requires_grad:
            wmg = getattr(self.weight, "main_grad", None)
            if wmg is None:
                raise ValueError(
                    "accumulate_into_main_grad: expected the weight to carry an fp32 .main_grad buffer, got none"
                )
            bmg = None if self.bias is None else getattr(self.bias, "main_grad", None)
            if self.bias is not None and bmg is None:
                raise ValueError(
                    "accumulate_into_main_grad: expected the bias to carry an fp32 .main_grad buffer too, got none"
                )
        return causal_conv1d_silu(
            x, self.weight, self.bias, activation=self.activation, program=self.program,
            weight_main_grad=wmg, bias_main_grad=bmg, layout=layout, **kwargs,
        )

    def new_cache(
        self, batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """A zero decoding cache for ``batch`` sequences: ``(batch, K-1, C)`` with ``"BLC"``,
        ``(batch, C, K-1)`` with ``"BCL"`` (the form of ``forward``'s final states, channels
        contiguous in both). ``dtype`` is the inputs' (default: the weight's)."""
        if not isinstance(batch, int) or batch < 0:
            fail("batch", "a non-negative int", repr(batch))
        cache = torch.zeros(
            batch, self._width - 1, self._channels,
            device=self.weight.device if device is None else device, dtype=dtype or self.weight.dtype,
        )
        return cache if self.layout == "BLC" else cache.transpose(1, 2)

    def step(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """Decode one token per sequence, updating ``cache`` in place.

        x: ``(B, C)``, or ``(B, 1, C)`` with ``"BLC"`` / ``(B, C, 1)`` with ``"BCL"``. cache: the
        module layout's state form, ``(B, W, C)`` with ``"BLC"`` / ``(B, C, W)`` with ``"BCL"``, in
        x's dtype, any strides, ``W >= K-1``: the prefill's final states (W = K-1) feed it
        directly, and causal-conv1d's / flash-linear-attention's W = K form works too (the last
        K-1 tokens are the window; the cache shifts by one and x becomes its last token).

        Returns y_t of x's shape: exactly (bitwise) what ``forward`` gives for this token after
        the tokens the cache holds. On CUDA, outside autograd, a step is one launch of the decoding
        kernel (graph capturable, the cache updated in it), which sums the taps as the forward
        kernel does; otherwise it runs the forward op with the window as initial states (so a
        step that needs gradients records them) and shifts the cache.
        """
        C, K = self._channels, self._width
        if not isinstance(x, torch.Tensor):
            fail("x", "a torch.Tensor", type(x).__name__, TypeError)
        B = x.shape[0] if x.dim() in (2, 3) else -1
        one = (B, 1, C) if self.layout == "BLC" else (B, C, 1)
        if tuple(x.shape) not in ((B, C), one):
            token = f"(B, 1, {C})" if self.layout == "BLC" else f"(B, {C}, 1)"
            fail("x", f"one token per sequence, shape (B, {C}) or {token}", tuple(x.shape))
        if not isinstance(cache, torch.Tensor):
            fail("cache", "a torch.Tensor", type(cache).__name__, TypeError)
        tokens = cache if self.layout == "BLC" or cache.dim() != 3 else cache.transpose(1, 2)
        if tokens.dim() != 3 or tokens.shape[0] != B or tokens.shape[2] != C or tokens.shape[1] < K - 1:
            want = f"({B}, W >= {K - 1}, {C})" if self.layout == "BLC" else f"({B}, {C}, W >= {K - 1})"
            fail("cache", f"shape {want}", tuple(cache.shape))
        if cache.dtype != x.dtype:
            fail("cache", f"x's dtype {x.dtype}", cache.dtype, TypeError)
        if cache.device != x.device:
            fail("cache", f"a tensor on {x.device} (the device of x)", cache.device)
        x_t = x.reshape(B, 1, C)
        params = (self.weight,) if self.bias is None else (self.weight, self.bias)
        grads = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *params))
        if not grads and self.program is None and ops.step_kernel(x):
            w = self.weight.detach()[:, 0]
            check_weight_for(w, x)
            b = None if self.bias is None else self.bias.detach()
            silu = activation_flag(self.activation)
            y = ops.update(x_t.transpose(1, 2), tokens.transpose(1, 2), w, b, silu, None, None)
            return y.reshape(x.shape)
        window = tokens[:, tokens.shape[1] - (K - 1):]
        if C > 1 and x_t.stride(-1) != 1:  # a column of a (B, C, L) tensor: the op reads channels contiguous
            x_t = x_t.contiguous()
        # a recorded backward reads the window after the cache has moved on: give it a copy
        y = self._op(x_t, "BLC", initial_states=window.clone() if torch.is_grad_enabled() else window)
        tokens.copy_(torch.cat([tokens[:, 1:], x_t], dim=1))
        return y.reshape(x.shape)

    @classmethod
    def from_conv1d(cls, conv: nn.Conv1d, activation: str | None = "silu", **kwargs) -> CausalConv1dSiLU:
        """A module with the parameters of a depthwise ``nn.Conv1d(C, C, K, groups=C)`` (copied)."""
        C = conv.in_channels
        if (conv.out_channels != C or conv.groups != C or conv.stride != (1,) or conv.dilation != (1,)
                or conv.padding_mode != "zeros"):
            raise ValueError(
                "conv: expected a depthwise nn.Conv1d(C, C, K, groups=C) with stride 1, dilation 1 and "
                f"zero padding, got {conv}"
            )
        m = cls(C, conv.kernel_size[0], conv.bias is not None, activation,
                device=conv.weight.device, dtype=conv.weight.dtype, **kwargs)
        with torch.no_grad():
            m.weight.copy_(conv.weight)
            if conv.bias is not None:
                m.bias.copy_(conv.bias)
        return m

    def to_conv1d(self) -> nn.Conv1d:
        """An ``nn.Conv1d(C, C, K, groups=C, padding=K-1)`` with these parameters (copied): its
        output's first L positions, through the activation, equal this module's."""
        conv = nn.Conv1d(self._channels, self._channels, self._width, groups=self._channels,
                         padding=self._width - 1, bias=self.bias is not None,
                         device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            conv.weight.copy_(self.weight)
            if self.bias is not None:
                conv.bias.copy_(self.bias)
        return conv

    def extra_repr(self) -> str:
        layout = "" if self.layout == "BLC" else f", layout={self.layout!r}"
        return (
            f"{self._channels}, kernel_size={self._width}, bias={self.bias is not None}, "
            f"activation={self.activation!r}{layout}"
        )
