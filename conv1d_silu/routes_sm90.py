"""Measured sm_90 (H100 / H200) route rows, written by ``python -m conv1d_silu.tune``.

Each variant maps to rules tried before the default; docs/routes-sm_90.md holds the timings that
chose them. Empty until the tuner has run on an H200.
"""

from __future__ import annotations

ROUTES: dict = {}
