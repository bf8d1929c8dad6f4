"""Shared fixtures: devices, hypothesis profiles, tolerances."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv1d_silu import runtime  # noqa: E402

HAS_CUDA = runtime.available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and CuPy")

# CI: a small fixed profile; tools/gpu-check selects the long one.
settings.register_profile(
    "ci", max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "gpu", max_examples=300, derandomize=False, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def slow_seconds(item: pytest.Item) -> float:
    """The GPU duration a test's ``slow(seconds)`` mark estimates (0: not marked)."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.args[0] if mark.args else 1)


def spread_slow(items: list, seconds) -> list:
    """``items`` with those of ``seconds(item) > 0`` first, longest first, each followed by one of
    the others (in their order), then the rest of the others."""
    slow = sorted((i for i in items if seconds(i)), key=lambda i: -seconds(i))
    fast = [i for i in items if not seconds(i)]
    paired = [i for k, s in enumerate(slow) for i in (s, *fast[k : k + 1])]
    return paired + fast[len(slow) :]


def pytest_collection_modifyitems(config, items):
    """Long tests first and apart. On the GPU the suite is compile-bound and a time limit cuts off
    whatever trails it. pytest-xdist (``--dist load``) deals its first tests out in consecutive
    chunks, two per worker with ``--maxschedchunk 1`` (tools/gpu-check), and later ones one or two
    at a time: with slow and unmarked tests alternating, every worker starts on its own long test
    (sorted together, they all landed on the first worker, one after the other)."""
    items[:] = spread_slow(items, slow_seconds)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Backends of the kernel-level tests: "cpu" (PyTorch reference), "emu" (the CUDA templates run on
# the CPU by tests/emulator, through the same planning code), "cuda" (the real kernels).
from dataclasses import dataclass  # noqa: E402

import emulator  # noqa: E402
from conv1d_silu import ops  # noqa: E402

RUN_EMULATOR = emulator.available() and (not HAS_CUDA or os.environ.get("CONV1D_SILU_TEST_EMULATOR") == "1")
BACKENDS = ["cpu"] + (["emu"] if RUN_EMULATOR else []) + (["cuda"] if HAS_CUDA else [])
KERNEL_BACKENDS = [b for b in BACKENDS if b != "cpu"]


@dataclass(frozen=True)
class Backend:
    name: str
    device: str

    @property
    def kernels(self) -> bool:
        return self.name != "cpu"


def _backend(name):
    if name == "emu":
        with ops.use_launcher(emulator.EmulatorLauncher(), emulate_arch="sm_90"):
            yield Backend("emu", "cpu")
    else:
        yield Backend(name, name)


@pytest.fixture(params=BACKENDS)
def backend(request):
    yield from _backend(request.param)


@pytest.fixture(params=KERNEL_BACKENDS or ["none"])
def kernel_backend(request):
    if request.param == "none":
        pytest.skip("no kernel backend (needs g++ for the emulator, or a GPU)")
    yield from _backend(request.param)


@pytest.fixture
def ticket_climb(monkeypatch):
    """Backward trees climbed by tickets at every size (no fold launch: gpu.split_fold never holds)."""
    from conv1d_silu import gpu

    monkeypatch.setattr(gpu, "FOLD_MAX_NODES", 0)
    gpu.backward_plan.cache_clear()
    yield
    monkeypatch.undo()
    gpu.backward_plan.cache_clear()
