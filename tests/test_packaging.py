"""The wheel's file list: every Python package and every kernel source the runtime reads ships."""

from __future__ import annotations

import fnmatch
import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_python_package_is_listed() -> None:
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "conv1d_silu").rglob("__init__.py")
    }
    assert found == set(_setuptools_config()["packages"])


def test_every_kernel_source_is_package_data() -> None:
    data = _setuptools_config()["package-data"]
    sources = [p for p in (ROOT / "conv1d_silu").rglob("*") if p.suffix in (".cu", ".cuh")]
    assert sources
    for src in sources:
        package = ".".join(src.parent.relative_to(ROOT).parts)
        assert any(fnmatch.fnmatch(src.name, g) for g in data.get(package, [])), src
