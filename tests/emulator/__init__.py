"""Run the CUDA kernel templates on the CPU (tests/emulator/cuda_emulator.h), through the same
planning code as the GPU path (conv1d_silu.gpu), so kernel logic is tested in CI without a GPU."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from conv1d_silu import kernels, runtime
from conv1d_silu.gpu import Launcher
from conv1d_silu.runtime import DeviceLimits, Driver, Launch, Prepared

HERE = Path(__file__).resolve().parent
CXX = shutil.which("g++") or shutil.which("c++")
_CACHE = Path(os.environ.get("CONV1D_SILU_EMULATOR_CACHE", Path(tempfile.gettempdir()) / "conv1d_silu_emulator"))
_libs: dict[str, ctypes.CDLL] = {}

DRIVER = r"""
#include "cuda_emulator.h"
#include "{source_file}"
#include <utility>
template <typename... P, size_t... N>
static void call_with(void (*f)(P...), void** a, std::index_sequence<N...>) {{
  f(*reinterpret_cast<P*>(a[N])...);
}}
template <typename... P>
static int launch_fn(void (*f)(P...), unsigned g, unsigned b, unsigned smem, void** a) {{
  return emu::run(g, b, smem, [&] {{ call_with(f, a, std::index_sequence_for<P...>()); }});
}}
extern "C" int emu_launch(unsigned g, unsigned b, unsigned smem, void** a) {{
  return launch_fn(&{kernel}, g, b, smem, a);
}}
"""

# Limits of a made-up small device, so persistent grids loop over several units per CTA.
LIMITS = DeviceLimits(sm_count=3, max_threads=1024, smem_default=48 * 1024, smem_optin=227 * 1024)


def available() -> bool:
    return CXX is not None


def _library(source: str, kernel: str) -> ctypes.CDLL:
    # The expanded text that NVRTC would compile (kernels.source, patched or not), not the file on disk.
    text = kernels.source(source)
    header = (HERE / "cuda_emulator.h").read_text()
    key = hashlib.sha256((DRIVER + kernel + text + header).encode()).hexdigest()[:20]
    lib = _libs.get(key)
    if lib is not None:
        return lib
    _CACHE.mkdir(parents=True, exist_ok=True)
    so = _CACHE / f"{key}.so"
    if not so.exists():
        text_tmp = _CACHE / f"{key}.{os.getpid()}.cu"  # workers may build the same key at once
        text_tmp.write_text(text)
        os.replace(text_tmp, _CACHE / f"{key}.cu")
        src = _CACHE / f"{key}.cpp"
        src.write_text(DRIVER.format(source_file=f"{key}.cu", kernel=kernel))
        tmp = _CACHE / f"{key}.{os.getpid()}.so"
        cmd = [
            CXX, "-std=c++20", "-O1", "-g0", "-fPIC", "-shared", "-fno-strict-aliasing",
            "-I", str(HERE), str(src), "-o", str(tmp),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"emulator build of {kernel} failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, so)
    runtime.record_instance(source, kernel)  # seeds the GPU suite's instance list without a GPU
    lib = ctypes.CDLL(str(so))
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_launch.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    _libs[key] = lib
    return lib


def _run(lib: ctypes.CDLL, kernel: str, grid: int, block: int, smem: int, params: int) -> None:
    status = lib.emu_launch(grid, block, smem, params)
    if status == 2:
        raise RuntimeError(f"emulator: {kernel}: the lanes of a warp met at different shuffles (or a partial mask)")
    if status != 0:
        raise RuntimeError(f"emulator: {kernel}: a __syncthreads() was skipped by exited threads")


class _Handle:
    """What the emulator's driver takes for a kernel's CUfunction: its library, and its name."""

    def __init__(self, launch: Launch):
        self.lib, self.kernel = _library(launch.source, launch.kernel), launch.kernel


def _launch_kernel(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
    assert (gy, gz, by, bz, extra) == (1, 1, 1, 1, 0)
    _run(handle.lib, handle.kernel, gx, bx, smem, params)


def _launch_kernel_ex(config_ref, handle, params, extra):
    """cuLaunchKernelEx: the geometry from the configuration the prepared launch filled in, which
    must carry the programmatic-serialization attribute."""
    cfg = config_ref._obj
    assert cfg.num_attrs == 1 and cfg.attrs[0].id == 6 and cfg.attrs[0].value[0] == 1 and extra is None
    assert tuple(cfg.grid)[1:] == (1, 1) and tuple(cfg.block)[1:] == (1, 1)
    PROGRAMMATIC.append(handle.kernel)
    _run(handle.lib, handle.kernel, cfg.grid[0], cfg.block[0], cfg.smem, params)
    return 0


PROGRAMMATIC: list[str] = []  # the kernels launched through cuLaunchKernelEx, in order
EMULATED = Driver(lambda: 0, lambda index: 0, _launch_kernel, _launch_kernel_ex, lambda index: contextlib.nullcontext())


class EmulatorLauncher(Launcher):
    """Runs launches on the CPU through the GPU path's prepared launches (:class:`Prepared`, with
    the emulator as the driver: a programmatic launch's cuLaunchKernelEx configuration included);
    records them for the tests that look at geometry."""

    def __init__(self, per_sm: int = 2):
        self.per_sm = per_sm
        self.launches: list[Launch] = []

    def sm_count(self, device: torch.device) -> int:
        return LIMITS.sm_count

    def max_active_blocks(self, launch: Launch, device: torch.device) -> int:
        return self.per_sm

    def prepare(self, launch: Launch, device: torch.device):
        prepared = Prepared(launch, LIMITS, 0, _Handle(launch), 0, True, EMULATED)

        def run(tensors, outputs=(), inputs=()):
            self.launches.append(launch.bind(tensors, outputs, inputs))
            prepared(tensors, outputs, inputs)

        return run

    def __call__(self, launch: Launch, device: torch.device) -> None:
        self.prepare(launch.planned or launch, device)(launch.tensors, launch.outputs, launch.inputs)
