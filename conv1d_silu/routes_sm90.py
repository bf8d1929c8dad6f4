"""Measured sm_90 route rows, written by ``python -m conv1d_silu.tune`` on NVIDIA H200
(2026-12-02 16:04:30, commit 20cb14489d). Evidence: docs/routes-sm_90.md."""

from __future__ import annotations

from .routes import INF, Rule

ROUTES: dict = {
    'bwd': [
        Rule('rowgroup_long', 264, 1024, 262144, why='measured on this arch: beats the default for 264 <= C < 1024, S >= 262144 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long', 1024, 4096, 65536, why='measured on this arch: beats the default for 1024 <= C < 4096, S >= 65536 (docs/routes-sm_90.md)'),
        Rule('rowgroup_sm_long', 4096, INF, 65536, why='measured on this arch: beats the default for 4096 <= C < inf, S >= 65536 (docs/routes-sm_90.md)'),
    ],
    'bwd_bias': [
        Rule('rowgroup_8b', 264, 4096, 65536, why='measured on this arch: beats the default for 264 <= C < 4096, S >= 65536 (docs/routes-sm_90.md)'),
        Rule('rowgroup_long', 4096, INF, 65536, why='measured on this arch: beats the default for 4096 <= C < inf, S >= 65536 (docs/routes-sm_90.md)'),
    ],
    'fwd': [
        Rule('fwd_rows_8b', 264, INF, 65536, why='measured on this arch: beats the default for 264 <= C < inf, S >= 65536 (docs/routes-sm_90.md)'),
    ],
    # Not measured yet (the tuner's next run will): the same forward kernel with a bias or a
    # document table, routed like 'fwd', whose 8-byte program won at every measured shape.
    'fwd_bias': [
        Rule('fwd_rows_8b', 264, INF, 65536, why="extrapolated from the 'fwd' rows (same kernel); re-run the tuner"),
    ],
    'fwd_dt': [
        Rule('fwd_rows_8b', 264, INF, 65536, why="extrapolated from the 'fwd' rows (same kernel); re-run the tuner"),
    ],
}
