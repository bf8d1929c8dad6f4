"""CuPy runtime: compile the kernel templates with NVRTC, cache them, validate and launch.

* Compiled once per (source, template instantiation, device); CuPy keeps the cubin on disk
  (``CUPY_CACHE_DIR``) and this module keeps the loaded function in-process.
* Launches go on ``torch.cuda.current_stream()`` of the tensors' device, under that device, with
  no host synchronisation and no CuPy allocation: a warmed-up call is CUDA-graph capturable.
* Every launch passes :func:`validate` first (grid/block shape, shared memory, output aliasing,
  index width).

CuPy is imported lazily, so importing conv1d_silu never initialises CUDA.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

import torch

from . import kernels

NVRTC_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()


@dataclass
class Launch:
    """One kernel launch: what to instantiate, the geometry and the argument list.

    ``args`` holds tensors (passed as device pointers), None (null pointers) and NumPy scalars
    whose types match the C signature (np.int32 for int, np.int64 for long long).
    """

    source: str
    kernel: str  # name expression of the template instantiation
    grid: tuple[int, int, int]
    block: int
    smem: int
    args: tuple
    outputs: tuple[torch.Tensor, ...] = ()
    inputs: tuple[torch.Tensor, ...] = ()
    one_d_grid: bool = True
    index_64: bool = False
    max_offset: int = 0  # largest element offset the kernel forms


@dataclass(frozen=True)
class DeviceLimits:
    sm_count: int
    max_threads: int
    smem_default: int
    smem_optin: int


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) byte range a tensor's elements occupy."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def validate(launch: Launch, limits: DeviceLimits) -> None:
    """Reject a launch that would be wrong or undefined on the device."""
    gx, gy, gz = launch.grid
    if launch.one_d_grid and (gy != 1 or gz != 1):
        raise ValueError(f"{launch.kernel}: this program needs a 1-D grid, got grid {launch.grid}")
    if not (1 <= gx < 2**31 and 1 <= gy < 65536 and 1 <= gz < 65536):
        raise ValueError(f"{launch.kernel}: grid {launch.grid} out of range")
    if not 1 <= launch.block <= min(limits.max_threads, 1024):
        raise ValueError(f"{launch.kernel}: block of {launch.block} threads out of range")
    if launch.smem > limits.smem_optin:
        raise ValueError(
            f"{launch.kernel}: {launch.smem} bytes of dynamic shared memory exceed the device limit "
            f"{limits.smem_optin}"
        )
    if not launch.index_64 and launch.max_offset >= 2**31:
        raise ValueError(f"{launch.kernel}: offsets up to {launch.max_offset} need 64-bit indexing")
    for out in launch.outputs:
        for inp in launch.inputs:
            if overlaps(out, inp):
                raise ValueError(f"{launch.kernel}: an output overlaps an input (outputs must be fresh)")


def available() -> bool:
    """True when CuPy imports and a CUDA device is visible."""
    return _cupy() is not None and torch.cuda.is_available()


@functools.lru_cache(maxsize=1)
def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # ImportError, or a CuPy that cannot load its CUDA libraries
        return None


def require_cupy():
    cp = _cupy()
    if cp is None:
        raise RuntimeError(
            "conv1d_silu: CUDA tensors need CuPy for the kernels; install the `cuda` extra "
            "(pip install 'conv1d_silu[cuda]', which brings cupy-cuda13x), or pass program='reference'"
        )
    return cp


@functools.lru_cache(maxsize=None)
def device_limits(index: int) -> DeviceLimits:
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, "shared_memory_per_block_optin", 48 * 1024)
    return DeviceLimits(props.multi_processor_count, props.max_threads_per_block, 48 * 1024, optin)


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message holds the compiler log and the flags."""


_functions: dict[tuple[str, str, int], object] = {}


def function(source: str, kernel: str, device_index: int):
    """The compiled kernel for this device (compiled on first use; thread-safe)."""
    key = (source, kernel, device_index)
    fn = _functions.get(key)
    if fn is not None:
        return fn
    cp = require_cupy()
    with _lock, cp.cuda.Device(device_index):
        fn = _functions.get(key)
        if fn is None:
            code = kernels.source(source)
            try:
                module = cp.RawModule(code=code, options=NVRTC_OPTIONS, name_expressions=[kernel])
                fn = module.get_function(kernel)
                fn.attributes  # forces compilation and load now, inside the lock  # noqa: B018
            except Exception as err:  # CompileException, or a load failure
                log = err.get_message() if hasattr(err, "get_message") else str(err)
                raise CompileError(
                    f"conv1d_silu: NVRTC could not build {kernel} from {source}.cu "
                    f"(options {NVRTC_OPTIONS}, device {device_index}):\n{log}"
                ) from err
            _functions[key] = fn
    return fn


_streams: dict[tuple[int, int], object] = {}


class _RawStream:
    """A bare CUDA stream handle in the CUDA stream protocol."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def current_stream_ptr(device_index: int) -> int:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _stream(device_index: int):
    ptr = current_stream_ptr(device_index)
    key = (device_index, ptr)
    s = _streams.get(key)
    if s is None:
        cp = require_cupy()
        from_external = getattr(cp.cuda.Stream, "from_external", None)
        if from_external is not None:
            s = from_external(_RawStream(ptr))
        else:  # CuPy < 14
            s = cp.cuda.ExternalStream(ptr, device_index)
        _streams[key] = s
    return s


_smem_raised: dict[int, int] = {}  # id(kernel function) -> the dynamic shared memory it allows


def _prepare_smem(fn, smem: int, device_index: int) -> None:
    """Raise the kernel's dynamic shared-memory limit past the 48 KB default when needed."""
    if smem > device_limits(device_index).smem_default and _smem_raised.get(id(fn), 0) < smem:
        fn.max_dynamic_shared_size_bytes = smem
        _smem_raised[id(fn)] = smem


@functools.lru_cache(maxsize=4096)
def max_active_blocks(source: str, kernel: str, block: int, smem: int, device_index: int) -> int:
    """Resident CTAs per SM for this instantiation (for persistent grids)."""
    fn = function(source, kernel, device_index)
    _prepare_smem(fn, smem, device_index)
    from cupy_backends.cuda.api import driver

    return max(1, driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, smem))


def _arg(a):
    if isinstance(a, torch.Tensor):
        return a.data_ptr()
    return a


def launch(spec: Launch, device: torch.device) -> None:
    """Validate and launch on the current stream of ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    validate(spec, device_limits(index))
    fn = function(spec.source, spec.kernel, index)
    cp = _cupy()
    with cp.cuda.Device(index):
        _prepare_smem(fn, spec.smem, index)
        fn(spec.grid, (spec.block, 1, 1), tuple(_arg(a) for a in spec.args), shared_mem=spec.smem, stream=_stream(index))


def warmup(device: torch.device | int | None = None, dtypes=(torch.bfloat16,), ks=(4,)) -> int:
    """Compile the common instantiations now (forward and backward, with and without bias) by
    running them once on small random inputs; returns the number of calls made."""
    from .api import causal_conv1d_silu

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else torch.device(device).index or 0)
    calls = 0
    for dtype in dtypes:
        for K in ks:
            for bias in (False, True):
                x = torch.randn(64, 64, device=dev, dtype=dtype, requires_grad=True)
                w = torch.randn(64, K, device=dev, dtype=dtype, requires_grad=True)
                b = torch.randn(64, device=dev, dtype=dtype, requires_grad=True) if bias else None
                causal_conv1d_silu(x, w, b).float().sum().backward()
                calls += 1
    return calls


def cache_dir() -> str:
    """CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``)."""
    return os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))

