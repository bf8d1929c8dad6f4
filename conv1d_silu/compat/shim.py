"""``install()``: the ``causal_conv1d`` package, served by conv1d_silu.

One finder on ``sys.meta_path`` imports the modules ``causal_conv1d``,
``causal_conv1d.causal_conv1d_interface``, ``causal_conv1d.cpp_functions`` and
``causal_conv1d.causal_conv1d_varlen`` (with a ``__spec__``, for ``importlib.util.find_spec``), and
answers ``importlib.metadata`` for the distribution ``causal_conv1d`` (for version gates).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import re
import sys
import warnings
from pathlib import Path

from . import cpp_functions, interface, references, varlen

PACKAGE = "causal_conv1d"
# Callers gate features on this version. Megatron takes >= 1.6.0 for its deterministic mode (our
# backward is always deterministic) and >= 1.7.0 for context parallelism over packed sequences,
# which passes seq_idx together with initial_states: the op refuses that pair, so the version stays
# below 1.7.0.
VERSION = "1.6.1+conv1d.silu"

MODULES = {
    PACKAGE: {
        "__version__": VERSION,
        "causal_conv1d_fn": interface.causal_conv1d_fn,
        "causal_conv1d_update": interface.causal_conv1d_update,
    },
    f"{PACKAGE}.causal_conv1d_interface": {
        "causal_conv1d_fn": interface.causal_conv1d_fn,
        "causal_conv1d_update": interface.causal_conv1d_update,
        "causal_conv1d_ref": references.causal_conv1d_ref,
        "causal_conv1d_update_ref": references.causal_conv1d_update_ref,
    },
    f"{PACKAGE}.cpp_functions": {
        name: getattr(cpp_functions, name)
        for name in (
            "causal_conv1d_fwd_function",
            "causal_conv1d_bwd_function",
            "causal_conv1d_update_function",
        )
    },
    f"{PACKAGE}.causal_conv1d_varlen": {
        "causal_conv1d_varlen_states": varlen.causal_conv1d_varlen_states,
        "causal_conv1d_varlen_states_ref": references.causal_conv1d_varlen_states_ref,
    },
}
CALLERS = ("mamba_ssm", "fla", "megatron.core.ssm")  # bind causal_conv1d's names at import


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Distribution(importlib.metadata.Distribution):
    """The metadata of the ``causal_conv1d`` that this package serves."""

    def read_text(self, filename):
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n"
        if filename == "top_level.txt":
            return f"{PACKAGE}\n"
        return None

    def locate_file(self, path):
        return Path(__file__).parent / path


class Finder(importlib.metadata.DistributionFinder, importlib.abc.Loader):
    """Finds and loads the ``causal_conv1d`` modules, and its distribution metadata."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, origin="conv1d_silu.compat", is_package=fullname == PACKAGE
        )

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        module.__dict__.update(MODULES[module.__name__])

    def find_distributions(self, context=None):
        context = context or importlib.metadata.DistributionFinder.Context()
        if context.path is not sys.path or (
            context.name is not None and _normalized(context.name) != _normalized(PACKAGE)
        ):
            return iter(())
        return iter((_Distribution(),))


FINDER = Finder()


def _ours(module: object) -> bool:
    return getattr(getattr(module, "__spec__", None), "loader", None) is FINDER


def _loaded() -> list[str]:
    return [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]


def install() -> None:
    """Serve ``import causal_conv1d`` (and its submodules and metadata) from conv1d_silu.compat.

    Call it once before importing mamba_ssm, fla, Megatron or transformers' modeling modules: they
    bind causal-conv1d's functions when imported. Raises RuntimeError if a real causal_conv1d is
    already imported; a second call does nothing."""
    real = [name for name in _loaded() if not _ours(sys.modules[name])]
    if real:
        found = getattr(sys.modules[real[0]], "__file__", None) or real[0]
        raise RuntimeError(
            f"conv1d_silu.compat.install(): causal_conv1d is already imported ({found}); call install() "
            "before anything imports causal_conv1d, or drop the causal_conv1d import"
        )
    if FINDER not in sys.meta_path:
        early = sorted(n for n in sys.modules if any(n == c or n.startswith(c + ".") for c in CALLERS))
        if early:
            warnings.warn(
                f"conv1d_silu.compat.install(): {', '.join(early[:3])}{', ...' if len(early) > 3 else ''} "
                "was imported first and keeps the causal_conv1d functions it bound then",
                stacklevel=2,
            )
        sys.meta_path.insert(0, FINDER)
    for name in MODULES:
        importlib.import_module(name)


def uninstall() -> None:
    """Undo :func:`install`: the finder leaves ``sys.meta_path``, the modules ``sys.modules``."""
    while FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)
    for name in _loaded():
        if _ours(sys.modules[name]):
            del sys.modules[name]
