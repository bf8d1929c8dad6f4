"""Every bad input raises TypeError / ValueError naming the argument, before any work."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline

from conv1d_silu import causal_conv1d_silu


def _err(exc, fn):
    with pytest.raises(exc) as info:
        fn()
    return str(info.value)


def base(**kw):
    args = dict(
        x=torch.randn(10, 4),
        weight=torch.randn(4, 3),
        bias=None,
    )
    args.update(kw)
    return lambda: causal_conv1d_silu(args.pop("x"), args.pop("weight"), args.pop("bias"), **args)


def test_x_not_a_tensor():
    assert_expected_inline(_err(TypeError, base(x=[1.0])), """x: expected a torch.Tensor, got list""")


def test_x_integer_dtype():
    assert_expected_inline(
        _err(TypeError, base(x=torch.zeros(10, 4, dtype=torch.int32))),
        """x: expected dtype float32, float16, bfloat16 or float64, got torch.int32""",
    )


def test_x_wrong_ndim():
    assert_expected_inline(_err(ValueError, base(x=torch.randn(10))), """x: expected shape (S, C) or (B, L, C), got (10,)""")


def test_x_channel_stride():
    assert_expected_inline(
        _err(ValueError, base(x=torch.randn(4, 10).t())),
        """x: expected channel stride 1 and evenly spaced tokens with token stride >= C (for 3-D x, batch stride = L * token stride), or for 3-D x token stride 1 (channel-first); call .contiguous(), got strides (1, 10) for shape (10, 4)""",
    )


def test_x_uneven_batch_stride():
    x = torch.randn(2, 12, 4)[:, :10]
    assert_expected_inline(
        _err(ValueError, base(x=x)),
        """x: expected channel stride 1 and evenly spaced tokens with token stride >= C (for 3-D x, batch stride = L * token stride), or for 3-D x token stride 1 (channel-first); call .contiguous(), got strides (48, 4, 1) for shape (2, 10, 4)""",
    )


def test_weight_wrong_channels():
    assert_expected_inline(
        _err(ValueError, base(weight=torch.randn(5, 3))),
        """weight: expected 4 channels (x.shape[-1]) in weight.shape[0], got 5""",
    )


@pytest.mark.parametrize("K", [1, 9])
def test_kernel_size_out_of_range(K):
    msg = _err(ValueError, base(weight=torch.randn(4, K)))
    assert msg == f"weight: expected kernel size K in [2, 8] (weight.shape[-1]), got {K}"


def test_weight_bad_shape():
    assert_expected_inline(
        _err(ValueError, base(weight=torch.randn(4, 2, 3))), """weight: expected shape (C, K) or (C, 1, K), got (4, 2, 3)"""
    )


def test_weight_dtype():
    assert_expected_inline(
        _err(TypeError, base(weight=torch.zeros(4, 3, dtype=torch.int64))),
        """weight: expected a floating dtype, got torch.int64""",
    )


def test_fp64_x_needs_fp64_weight():
    assert_expected_inline(
        _err(TypeError, base(x=torch.randn(10, 4, dtype=torch.float64))),
        """weight: expected float64 with float64 x, got torch.float32""",
    )


def test_bias_shape_and_dtype():
    assert_expected_inline(_err(ValueError, base(bias=torch.randn(3))), """bias: expected shape (4,), got (3,)""")
    assert_expected_inline(
        _err(TypeError, base(bias=torch.randn(4, dtype=torch.float64))),
        """bias: expected the weight's dtype torch.float32, got torch.float64""",
    )


def test_mismatched_devices():
    meta = torch.randn(4, 3, device="meta")
    assert_expected_inline(
        _err(ValueError, base(weight=meta)), """weight: expected a tensor on cpu (the device of x), got meta"""
    )


def test_seq_idx_dtype_shape_and_order():
    assert_expected_inline(
        _err(TypeError, base(seq_idx=torch.zeros(10, dtype=torch.int16))),
        """seq_idx: expected dtype torch.int32 or torch.int64, got torch.int16""",
    )
    assert_expected_inline(
        _err(ValueError, base(seq_idx=torch.tensor([0] * 5 + [2**31] * 5))),
        """seq_idx: expected values < 2**31, got 2147483648""",
    )
    assert_expected_inline(  # an int64 padding id below int32's range would wrap to a document id
        _err(ValueError, base(seq_idx=torch.tensor([0] * 2 + [-(2**32) + 1] * 3 + [1] * 5))),
        """seq_idx: expected values >= -2**31 (negative: padding), got -4294967295""",
    )
    assert_expected_inline(
        _err(ValueError, base(seq_idx=torch.zeros(9, dtype=torch.int32))),
        """seq_idx: expected shape (10,) (one entry per token), got (9,)""",
    )
    bad = torch.tensor([0, 0, 1, 1, 0, 2, 2, 2, 2, 2], dtype=torch.int32)
    assert_expected_inline(
        _err(ValueError, base(seq_idx=bad)),
        """seq_idx: expected non-decreasing values within each sequence (negative values mark padding)""",
    )
    rejoined = torch.tensor([0, 0, -1, -1, 0, 2, 2, 2, 2, 2], dtype=torch.int32)
    assert_expected_inline(
        _err(ValueError, base(seq_idx=rejoined)),
        """seq_idx: expected a new document after padding (negative values), got the one before it again""",
    )


def test_seq_idx_beyond_initial_states():
    seq = torch.tensor([0] * 5 + [2] * 5, dtype=torch.int32)
    assert_expected_inline(
        _err(ValueError, base(seq_idx=seq, initial_states=torch.randn(2, 2, 4))),
        """seq_idx: expected values < initial_states.shape[0] == 2, got 2""",
    )


def test_cu_seqlens_checks():
    assert_expected_inline(
        _err(TypeError, base(cu_seqlens=torch.tensor([0, 10], dtype=torch.int16))),
        """cu_seqlens: expected dtype torch.int32 or torch.int64, got torch.int16""",
    )
    assert_expected_inline(
        _err(ValueError, base(cu_seqlens=torch.tensor([0, 2**32 + 10]))),
        """cu_seqlens: expected cu_seqlens[-1] == S == 10, got 4294967306""",
    )
    assert_expected_inline(
        _err(ValueError, base(cu_seqlens=torch.tensor([1, 10], dtype=torch.int32))),
        """cu_seqlens: expected cu_seqlens[0] == 0, got 1""",
    )
    assert_expected_inline(
        _err(ValueError, base(cu_seqlens=torch.tensor([0, 9], dtype=torch.int32))),
        """cu_seqlens: expected cu_seqlens[-1] == S == 10, got 9""",
    )
    assert_expected_inline(
        _err(ValueError, base(cu_seqlens=torch.tensor([0, 6, 4, 10], dtype=torch.int32))),
        """cu_seqlens: expected non-decreasing offsets""",
    )
    assert_expected_inline(
        _err(ValueError, base(cu_seqlens=torch.tensor([0], dtype=torch.int32))),
        """cu_seqlens: expected shape (N + 1,) with N >= 1, got (1,)""",
    )


def test_cu_seqlens_with_3d_x_and_both_tables():
    x3 = torch.randn(2, 5, 4)
    assert_expected_inline(
        _err(ValueError, base(x=x3, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32))),
        """cu_seqlens: expected None for 3-D x of several batch rows (each row is a document), got a tensor""",
    )
    assert_expected_inline(
        _err(
            ValueError,
            base(seq_idx=torch.zeros(10, dtype=torch.int32), cu_seqlens=torch.tensor([0, 10], dtype=torch.int32)),
        ),
        """seq_idx: expected None when cu_seqlens is given (pass one document table), got both""",
    )


def test_initial_states_shape_and_dtype():
    assert_expected_inline(
        _err(ValueError, base(initial_states=torch.randn(1, 3, 4))),
        """initial_states: expected shape (1, 2, 4) (documents, K-1, C), got (1, 3, 4)""",
    )
    assert_expected_inline(
        _err(TypeError, base(initial_states=torch.randn(1, 2, 4, dtype=torch.float64))),
        """initial_states: expected x's dtype torch.float32, got torch.float64""",
    )


def test_final_states_with_seq_idx_need_a_count():
    assert_expected_inline(
        _err(ValueError, base(seq_idx=torch.zeros(10, dtype=torch.int32), return_final_states=True)),
        """return_final_states: expected initial_states (which sets the document count) when seq_idx is given; or use cu_seqlens, got no initial_states""",
    )


def test_activation_and_grad_dtype_and_program():
    assert_expected_inline(_err(ValueError, base(activation="gelu")), """activation: expected 'silu', 'swish' or None, got 'gelu'""")
    assert_expected_inline(
        _err(TypeError, base(grad_dtype=torch.float16)),
        """grad_dtype: expected None, torch.float32 or the weight's dtype torch.float32, got torch.float16""",
    )
    assert_expected_inline(_err(ValueError, base(program="nope")), """program: expected one of ['bwd_bcl', 'bwd_bcl_chain2', 'fwd_bcl', 'fwd_flat16_8b', 'fwd_rows', 'fwd_rows16_8b', 'fwd_rows16_8b_a32', 'fwd_rows16_8b_a64', 'fwd_rows_8b', 'fwd_rows_8b_a32', 'fwd_rows_8b_a64', 'reference', 'rowgroup', 'rowgroup2_8b', 'rowgroup2_8b_a128', 'rowgroup_8b', 'rowgroup_8b_a128', 'rowgroup_8b_a32', 'rowgroup_flat2_8b', 'rowgroup_flat_8b', 'rowgroup_long', 'rowgroup_long16_8b', 'rowgroup_long_8b', 'rowgroup_long_8b_a32', 'rowgroup_long_8b_a64', 'rowgroup_long_flat32', 'rowgroup_long_flat32_8b', 'rowgroup_long_flat_8b', 'rowgroup_sm', 'rowgroup_sm_long'], got 'nope'""")
    assert_expected_inline(
        _err(ValueError, base(program="rowgroup")), """program: 'rowgroup' runs on CUDA tensors only, got tensors on the CPU"""
    )


def test_main_grad_buffers():
    assert_expected_inline(
        _err(TypeError, base(weight_main_grad=torch.zeros(4, 3, dtype=torch.bfloat16))),
        """weight_main_grad: expected dtype torch.float32, got torch.bfloat16""",
    )
    assert_expected_inline(
        _err(ValueError, base(weight_main_grad=torch.zeros(4, 4))),
        """weight_main_grad: expected a contiguous buffer of shape (4, 3) or (4, 1, 3), got (4, 4)""",
    )
    assert_expected_inline(  # the right count of elements in the wrong shape
        _err(ValueError, base(weight_main_grad=torch.zeros(3, 4))),
        """weight_main_grad: expected a contiguous buffer of shape (4, 3) or (4, 1, 3), got (3, 4)""",
    )


def test_bad_input_launches_nothing(monkeypatch):
    """Validation runs before any implementation is called."""
    from conv1d_silu import ops

    called = []
    monkeypatch.setattr(ops, "forward_impl", lambda *a, **k: called.append(1))
    with pytest.raises(ValueError):
        causal_conv1d_silu(torch.randn(10, 4), torch.randn(4, 3), cu_seqlens=torch.tensor([0, 9], dtype=torch.int32))
    assert not called


def test_bcl_checks_the_dtype_before_copying():
    """A channel-first x is copied to channel-last; an integer one is refused first, naming x."""
    assert_expected_inline(
        _err(TypeError, lambda: causal_conv1d_silu(torch.zeros(2, 4, 10, dtype=torch.int64), torch.randn(4, 3), layout="BCL")),
        """x: expected dtype float32, float16, bfloat16 or float64, got torch.int64""",
    )
