"""Measured sm_90 route rows, written by ``python -m conv1d_silu.tune`` on NVIDIA H200
(2026-12-02 17:42:53, commit cf9bd89713). Evidence: docs/routes-sm_90.md."""

from __future__ import annotations

from .routes import INF, Rule

ROUTES: dict = {
    'bwd': [
        Rule('rowgroup_8b', 64, 472, 32768, why='measured on this arch: beats the default for 64 <= C < 472, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 472, INF, 32768, why='measured on this arch: beats the default for 472 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'bwd_bias': [
        Rule('rowgroup_8b', 64, 472, 32768, why='measured on this arch: beats the default for 64 <= C < 472, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 472, 480, 32768, why='measured on this arch: beats the default for 472 <= C < 480, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_8b', 480, 496, 32768, why='measured on this arch: beats the default for 480 <= C < 496, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 496, INF, 32768, why='measured on this arch: beats the default for 496 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'bwd_bias_fp32g': [
        Rule('rowgroup_8b', 64, 488, 32768, why='measured on this arch: beats the default for 64 <= C < 488, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 488, INF, 32768, why='measured on this arch: beats the default for 488 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'bwd_dt': [
        Rule('rowgroup_8b', 64, 640, 32768, why='measured on this arch: beats the default for 64 <= C < 640, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 640, INF, 32768, why='measured on this arch: beats the default for 640 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'bwd_fp32g': [
        Rule('rowgroup_8b', 64, 472, 32768, why='measured on this arch: beats the default for 64 <= C < 472, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 472, 480, 32768, why='measured on this arch: beats the default for 472 <= C < 480, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_8b', 480, 504, 32768, why='measured on this arch: beats the default for 480 <= C < 504, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long_8b', 504, INF, 32768, why='measured on this arch: beats the default for 504 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'fwd': [
        Rule('fwd_rows16_8b', 64, INF, 32768, why='measured on this arch: beats the default for 64 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'fwd_bias': [
        Rule('fwd_rows16_8b', 64, 336, 32768, why='measured on this arch: beats the default for 64 <= C < 336, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 336, 344, 32768, why='measured on this arch: beats the default for 336 <= C < 344, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 344, 448, 32768, why='measured on this arch: beats the default for 344 <= C < 448, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 448, 456, 32768, why='measured on this arch: beats the default for 448 <= C < 456, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 456, INF, 32768, why='measured on this arch: beats the default for 456 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
    'fwd_dt': [
        Rule('fwd_rows16_8b', 64, 128, 32768, why='measured on this arch: beats the default for 64 <= C < 128, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 128, 264, 32768, why='measured on this arch: beats the default for 128 <= C < 264, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 264, 288, 32768, why='measured on this arch: beats the default for 264 <= C < 288, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 288, 296, 32768, why='measured on this arch: beats the default for 288 <= C < 296, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 296, 304, 32768, why='measured on this arch: beats the default for 296 <= C < 304, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 304, 312, 32768, why='measured on this arch: beats the default for 304 <= C < 312, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 312, 336, 32768, why='measured on this arch: beats the default for 312 <= C < 336, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 336, 344, 32768, why='measured on this arch: beats the default for 336 <= C < 344, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 344, 352, 32768, why='measured on this arch: beats the default for 344 <= C < 352, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 352, 360, 32768, why='measured on this arch: beats the default for 352 <= C < 360, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 360, 448, 32768, why='measured on this arch: beats the default for 360 <= C < 448, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows_8b', 448, 456, 32768, why='measured on this arch: beats the default for 448 <= C < 456, S >= 32768 (docs/routes-sm_90.md)'),
        Rule('fwd_rows16_8b', 456, INF, 32768, why='measured on this arch: beats the default for 456 <= C < inf, S >= 32768 (docs/routes-sm_90.md)'),
    ],
}
