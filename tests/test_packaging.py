"""The wheel's file list: every Python package, kernel source and route table the runtime reads ships."""

from __future__ import annotations

import fnmatch
import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_folder_of_the_package_is_listed() -> None:
    """Every folder ships: the Python packages and the data-only ones (route_tables)."""
    found = {
        ".".join(d.relative_to(ROOT).parts)
        for d in [ROOT / "conv1d_silu", *(ROOT / "conv1d_silu").rglob("*")]
        if d.is_dir() and d.name != "__pycache__"
    }
    assert found == set(_setuptools_config()["packages"])


def _is_package_data(path: pathlib.Path, data: dict | None = None) -> bool:
    """Whether a package-data glob (``data``: pyproject.toml's) of the listed package holding ``path`` matches it."""
    data = _setuptools_config()["package-data"] if data is None else data
    package = ".".join(path.parent.relative_to(ROOT).parts)
    return any(fnmatch.fnmatch(path.name, g) for g in data.get(package, []))


def test_every_kernel_source_is_package_data() -> None:
    sources = [p for p in (ROOT / "conv1d_silu").rglob("*") if p.suffix in (".cu", ".cuh")]
    assert sources
    for src in sources:
        assert _is_package_data(src), src


def test_every_route_table_is_package_data() -> None:
    tables = sorted((ROOT / "conv1d_silu" / "route_tables").glob("*.json"))
    assert {t.name for t in tables} >= {"sm_90.json", "sm_107a.json"}
    for table in tables:
        assert _is_package_data(table), table
    # and the check would see a table left out
    assert not _is_package_data(tables[0], {"conv1d_silu": ["py.typed", "*.json"], "conv1d_silu.kernels": ["*.cu", "*.cuh"]})
