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


def programmatic_launches() -> bool:
    """Whether the fold kernel may start early by programmatic dependent launch (sm_90+, a CUDA 12.3
    driver). ``CONV1D_SILU_PROGRAMMATIC=0`` forces plain stream-ordered launches, the path every
    older GPU takes (the tests run it on an sm_90 GPU too); the bits are the same."""
    return os.environ.get("CONV1D_SILU_PROGRAMMATIC", "1") not in ("0", "false", "False", "")
