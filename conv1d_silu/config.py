"""Environment switches (all prefixed ``CONV1D_SILU_``), read at call time so tests can set them."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("conv1d_silu")
_level = os.environ.get("CONV1D_SILU_LOG_LEVEL")
if _level:
    logger.setLevel(_level.upper())


def forced_program() -> str | None:
    """Program name forced by ``CONV1D_SILU_PROGRAM`` (None when unset or empty)."""
    return os.environ.get("CONV1D_SILU_PROGRAM") or None


def check_documents() -> bool:
    """Whether document tables on the GPU are checked for content (costs one host sync per call).

    ``CONV1D_SILU_CHECK_DOCS=0`` turns the check off; kernels stay memory-safe for any table content.
    """
    return os.environ.get("CONV1D_SILU_CHECK_DOCS", "1") not in ("0", "false", "False", "")
