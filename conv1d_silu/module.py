"""``CausalConv1dSiLU``: the short convolution of Mamba-style blocks as an nn.Module."""

from __future__ import annotations

import math

import torch
from torch import nn

from .api import causal_conv1d_silu
from .validation import activation_flag


class CausalConv1dSiLU(nn.Module):
    """Causal depthwise conv1d + SiLU over ``(B, L, C)`` or packed ``(S, C)`` tokens.

    Parameters are those of ``nn.Conv1d(C, C, K, groups=C, bias=bias)`` (weight ``(C, 1, K)``),
    so state dicts load in both directions; the initialisation matches nn.Conv1d's too.

    Args:
        channels: C.
        kernel_size: K, 2..8.
        bias: learn a bias.
        activation: ``"silu"`` or None.
        accumulate_into_main_grad: when the weight carries an fp32 ``main_grad`` buffer
            (Megatron), add the weight/bias gradients into it in place instead of ``.grad``.
        program: force a kernel program (tests, benchmarks).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 4,
        bias: bool = True,
        activation: str | None = "silu",
        *,
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
        factory = {"device": device, "dtype": dtype}
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.accumulate_into_main_grad, self.program = accumulate_into_main_grad, program
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(channels, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Conv1d's initialisation (fan_in = K for a depthwise filter)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.kernel_size)
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
        wmg = bmg = None
        if self.accumulate_into_main_grad and getattr(self.weight, "main_grad", None) is not None:
            wmg = self.weight.main_grad
            bmg = getattr(self.bias, "main_grad", None) if self.bias is not None else None
        return causal_conv1d_silu(
            x,
            self.weight,
            self.bias,
            seq_idx=seq_idx,
            cu_seqlens=cu_seqlens,
            initial_states=initial_states,
            return_final_states=return_final_states,
            activation=self.activation,
            program=self.program,
            weight_main_grad=wmg,
            bias_main_grad=bmg,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.channels}, kernel_size={self.kernel_size}, bias={self.bias is not None}, "
            f"activation={self.activation!r}"
        )
