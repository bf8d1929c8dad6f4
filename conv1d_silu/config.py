"""Environment switches (all prefixed ``CONV1D_SILU_``), read at call time so tests can set them."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("conv1d_silu")
_level = os.environ.get("CONV1D_SILU_LOG_LEVEL")
if _level:
    logger.setLevel(_level.upper())


def getenv(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, read afresh by every call at a seventh of its cost for an
    unset name: ``os.environ.get`` raises and catches a KeyError inside (0.7 µs against 0.1 on a fast
    host; 1.4-2.6 µs on a slow one). The mapping's own dict (``os.environ._data``, which assignment,
    ``del``, ``pop`` and ``monkeypatch`` all update) is looked up by the encoded name; a stand-in
    mapping without one is read through its ``get``."""
    env = os.environ
    data = getattr(env, "_data", None)
    if data is None:
        return env.get(name, default)
    value = data.get(_encoded.get(name) or _encoded.setdefault(name, env.encodekey(name)))
    return default if value is None else env.decodevalue(value)


_encoded: dict[str, object] = {}  # name -> its key in os.environ._data


def forced_program() -> str | None:
    """Program name forced by ``CONV1D_SILU_PROGRAM`` (None when unset or empty)."""
    return getenv("CONV1D_SILU_PROGRAM") or None


def record_instances() -> str | None:
    """A file that every kernel instance compiled in this process is appended to
    (``CONV1D_SILU_RECORD_INSTANCES``; tools/gpu-check sets it, tools/warm_kernels.py reads it)."""
    return getenv("CONV1D_SILU_RECORD_INSTANCES") or None


def check_documents() -> bool:
    """Whether document tables on the GPU are checked for content (costs one host sync per call).

    ``CONV1D_SILU_CHECK_DOCS=0`` turns the check off; kernels stay memory-safe for any table content.
    """
    return getenv("CONV1D_SILU_CHECK_DOCS", "1") not in ("0", "false", "False", "")


def programmatic_launches() -> bool:
    """Whether the fold kernel may start early by programmatic dependent launch (sm_90+, a CUDA 12.3
    driver). ``CONV1D_SILU_PROGRAMMATIC=0`` forces plain stream-ordered launches, the path every
    older GPU takes (the tests run it on an sm_90 GPU too); the bits are the same."""
    return getenv("CONV1D_SILU_PROGRAMMATIC", "1") not in ("0", "false", "False", "")
