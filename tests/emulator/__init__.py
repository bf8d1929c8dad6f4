"""Run the CUDA kernel templates on the CPU (tests/emulator/cuda_emulator.h), through the same
planning code as the GPU path (conv1d_silu.gpu), so kernel logic is tested in CI without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from conv1d_silu import kernels
from conv1d_silu.gpu import Launcher
from conv1d_silu.runtime import DeviceLimits, Launch, pack_args, validate

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
    lib = ctypes.CDLL(str(so))
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_launch.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    _libs[key] = lib
    return lib


class EmulatorLauncher(Launcher):
    """Runs launches on the CPU; records them for the tests that look at geometry."""

    def __init__(self, per_sm: int = 2):
        self.per_sm = per_sm
        self.launches: list[Launch] = []

    def sm_count(self, device: torch.device) -> int:
        return LIMITS.sm_count

    def max_active_blocks(self, launch: Launch, device: torch.device) -> int:
        return self.per_sm

    def __call__(self, launch: Launch, device: torch.device) -> None:
        validate(launch, LIMITS)
        self.launches.append(launch)
        lib = _library(launch.source, launch.kernel)
        params = pack_args(launch)  # the GPU path's slots and the pointers to them
        rc = lib.emu_launch(launch.grid[0], launch.block, launch.smem, params.pointers_addr)
        if rc != 0:
            raise RuntimeError(f"emulator: {launch.kernel}: a __syncthreads() was skipped by exited threads")
