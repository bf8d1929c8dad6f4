"""The kernel emulator's warp shuffles (tests/emulator/cuda_emulator.h): a kernel whose lanes meet
at different shuffles, or shuffle with a partial mask, fails its launch, as it would be wrong (or
undefined) on a GPU; a warp-uniform shuffle moves the values a GPU's would."""

from __future__ import annotations

import ctypes

import emulator
import pytest

pytestmark = pytest.mark.skipif(not emulator.available(), reason="needs g++ for the emulator")

PROBE = r"""
template <int MODE> __global__ void probe(int* out) {
  const int lane = (int)threadIdx.x % 32;
  int v = (int)threadIdx.x;
  if (MODE == 0) v = __shfl_down_sync(0xffffffffu, v, 1) + 1000 * __shfl_up_sync(0xffffffffu, v, 2);
  if (MODE == 1) {  // lane 31 at another call: two shuffles of equal count, diverged
    if (lane == 31) {
      v = __shfl_sync(0xffffffffu, v, 0);
    } else {
      v = __shfl_down_sync(0xffffffffu, v, 1);
    }
  }
  if (MODE == 2) v = __shfl_down_sync(0x0000ffffu, v, 1);
  out[threadIdx.x] = v;
}
"""


def _launch(monkeypatch, mode: int, block: int = 64) -> list[int]:
    monkeypatch.setattr(emulator.kernels, "source", lambda name: PROBE)
    monkeypatch.setattr(emulator.runtime, "record_instance", lambda *args: None)  # no package kernel
    kernel = f"probe<{mode}>"
    lib = emulator._library("emulator_probe", kernel)
    out = (ctypes.c_int * block)()
    arg = ctypes.c_void_p(ctypes.addressof(out))
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    emulator._run(lib, kernel, 1, block, 0, ctypes.addressof(params))
    return list(out)


def test_a_warp_uniform_shuffle_moves_what_a_gpus_would(monkeypatch):
    got = _launch(monkeypatch, 0)
    for t in range(64):
        lane = t % 32
        down = t + 1 if lane < 31 else t  # the top lane keeps its own value
        up = t - 2 if lane >= 2 else t
        assert got[t] == down + 1000 * up, t


@pytest.mark.parametrize("mode", [1, 2], ids=["diverged", "partial-mask"])
def test_lanes_at_different_shuffles_fail_the_launch(monkeypatch, mode):
    with pytest.raises(RuntimeError, match="different shuffles"):
        _launch(monkeypatch, mode)
