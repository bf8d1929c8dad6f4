"""CUDA C++ kernel sources (a forward and a backward template for each layout, a decoding-step
template) and their instantiation names."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parent
SOURCES = ("conv1d_silu_fwd", "conv1d_silu_bwd", "conv1d_silu_bcl", "conv1d_silu_update")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)
# a comment, or a string literal (kept whole: a comment marker inside one is text)
_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.DOTALL)

# The fields of each kernel's argument struct, in order (common.cuh: FwdArgs, BwdArgs, FoldArgs,
# FwdBclArgs, BwdBclArgs, UpdateArgs):
# the host fills them by name and packs them as 8-byte slots.
ARGS = {
    "conv1d_silu_fwd": (
        "x", "x_rs", "w", "bias", "table", "row_len", "n_docs", "init", "y", "final_states", "S", "C",
        "tile_v", "n_ctiles", "n_units",
    ),
    "conv1d_silu_bwd": (
        "x", "x_rs", "dy", "dy_rs", "w", "bias", "table", "row_len", "n_docs", "init", "dx", "dinit", "dw", "db",
        "accumulate", "workspace", "tickets", "S", "C", "tile_v", "n_ctiles", "n_units", "root_level", "next_x",
        "next_dy", "n_next", "n_vec", "split",
    ),
    "conv1d_silu_fold": ("workspace", "dw", "db", "accumulate", "C", "n_nodes", "levels"),
    "conv1d_silu_fwd_bcl": (
        "x", "x_bs", "x_cs", "w", "bias", "table", "n_docs", "init", "y", "y_bs", "y_cs", "final_states", "S", "C",
        "L", "n_chunks",
    ),
    "conv1d_silu_bwd_bcl": (
        "x", "x_bs", "x_cs", "dy", "dy_bs", "dy_cs", "w", "bias", "table", "n_docs", "init", "dx", "dx_bs", "dx_cs",
        "dinit", "dw", "db", "accumulate", "workspace", "S", "C", "L", "n_parts", "part_slabs", "top_level",
        "root_level",
    ),
    "conv1d_silu_update": (
        "x", "x_bs", "x_cs", "x_ls", "state", "state_bs", "state_cs", "state_ls", "state_len", "w", "bias",
        "cache_seqlens", "state_indices", "out", "out_bs", "out_cs", "out_ls", "C", "L",
    ),
}

CXX_TYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.bfloat16: "c1s::bf16",
    torch.float16: "c1s::f16",
}


def code_only(text: str) -> str:
    """``text`` without its comments (a block comment is one space, as to the compiler), trailing
    blanks and empty lines: the code alone."""
    text = _COMMENT_OR_STRING.sub(lambda m: m[0] if m[0][0] == '"' else " " if m[0][1] == "*" else "", text)
    return "".join(line.rstrip() + "\n" for line in text.splitlines() if line.strip())


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The kernel source with its local includes inlined, as code only (:func:`code_only`): the code
    alone keys every cache (CuPy's, the emulator's), so an edit to a comment recompiles nothing. NVRTC's
    line numbers are this text's."""
    seen: set[str] = set()

    def expand(path: Path) -> str:
        text = path.read_text()

        def include(m: re.Match) -> str:
            inc = m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(KERNEL_DIR / inc)

        return _INCLUDE.sub(include, text)

    return code_only(expand(KERNEL_DIR / f"{name}.cu"))


def source_hash(name: str) -> str:
    return hashlib.sha256(source(name).encode()).hexdigest()[:16]


def cxx(value: object) -> str:
    """A template argument in C++ spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return CXX_TYPES[value]
    return str(value)


def name_expression(kernel: str, *template_args: object) -> str:
    return f"{kernel}<{', '.join(cxx(a) for a in template_args)}>"


def with_instances(code: str, exprs: list[str]) -> str:
    """``code`` with explicit instantiations of the kernels ``exprs`` (name expressions), for nvcc,
    which has no NVRTC name expressions to instantiate templates with."""
    return code + "\n" + "\n".join(f"template __global__ decltype({e}) {e};" for e in exprs)
