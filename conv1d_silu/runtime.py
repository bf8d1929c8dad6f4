"""CuPy runtime: compile the kernel templates with NVRTC, cache them, validate and launch.

* Compiled once per (source, template instantiation, device); CuPy keeps the cubin on disk
  (``CUPY_CACHE_DIR``) and this module keeps the loaded function in-process.
* Launches go on ``torch.cuda.current_stream()`` of the tensors' device through
  ``cuLaunchKernel`` (CuPy's driver binding) with every parameter packed as 8 bytes, in the CUDA
  context CuPy loaded the kernel in; no host synchronisation and no CuPy allocation: a warmed-up
  call is CUDA-graph capturable.
* A planned launch is prepared once per device (:class:`Prepared`: grid/block shape, shared memory
  and index width checked, the kernel looked up); each call checks only the overlap of outputs it
  did not allocate, writes its tensors' addresses and submits.

CuPy is imported lazily, so importing conv1d_silu never initialises CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import config, kernels

NVRTC_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()


class Args:
    """The argument struct of a kernel (``kernels.ARGS``: every field 8 bytes, a pointer or a
    ``long long``), planned once: ``ints`` are the integer fields, and the pointer fields that are
    null for every call (0); the other fields named in ``tensors`` take a call's tensors, passed in
    the order of ``tensors`` (:meth:`packed`)."""

    __slots__ = ("fields", "tensors", "ints", "_values", "_tensor_slots")

    def __init__(self, kernel: str, tensors: tuple[str, ...], **ints: int):
        fields = kernels.ARGS[kernel]
        if set(tensors) | set(ints) != set(fields) or len(set(tensors)) + len(ints) < len(fields):
            names = sorted({*tensors, *ints})
            raise ValueError(f"{kernel}: arguments {names} do not match the struct's fields {fields}")
        self.fields, self.tensors, self.ints = fields, tensors, ints
        self._values = [ints.get(name, 0) for name in fields]
        # (field, position in a call's tensors) of each field that takes a call's tensor
        self._tensor_slots = tuple((fields.index(name), i) for i, name in enumerate(tensors) if name not in ints)

    def packed(self, tensors: tuple[torch.Tensor | None, ...]) -> Params:
        """The struct with a call's ``tensors``, in a buffer of its own: what a prepared launch
        (:class:`Prepared`) writes into its per-thread buffer, spelled out for the tests and tools."""
        params = Params(self._values)
        slots = params.slots
        for slot, i in self._tensor_slots:
            slots[slot] = tensors[i].data_ptr()
        return params


class Params:
    """One kernel's parameters: its argument struct as 8-byte slots, and the one-entry array of
    parameter pointers that ``cuLaunchKernel`` takes (it copies the struct at the call, so a thread
    reuses the slots launch after launch)."""

    __slots__ = ("pointers", "pointers_addr", "slots")

    def __init__(self, values: list[int]):
        self.slots = (ctypes.c_int64 * len(values))(*values)
        self.pointers = (ctypes.c_void_p * 1)(ctypes.addressof(self.slots))
        self.pointers_addr = ctypes.addressof(self.pointers)


@dataclass(slots=True)
class Launch:
    """One kernel launch: what to instantiate, the geometry and the arguments.

    A launch is planned once per call signature (``tensors`` empty) and bound to each call's
    tensors (:meth:`bind`): the pointer fields of its argument struct ``args`` in the order of
    ``args.tensors`` (None where the plan has a null pointer), and the outputs and inputs among them.
    """

    source: str
    kernel: str  # name expression of the template instantiation
    grid: tuple[int, int, int]
    block: int
    smem: int
    args: Args | None
    tensors: tuple[torch.Tensor | None, ...] = ()
    outputs: tuple[torch.Tensor, ...] = ()
    inputs: tuple[torch.Tensor, ...] = ()
    one_d_grid: bool = True
    index_64: bool = False
    max_offset: int = 0  # largest element offset the kernel forms
    # may start while the previous kernel in the stream still runs (programmatic dependent launch,
    # sm_90+); the kernel waits for it in-kernel (griddepcontrol.wait) before reading its results
    programmatic: bool = False
    planned: Launch | None = None  # the planned launch a call's launch binds
    ready: dict[int, Prepared] | None = None  # a planned launch: prepared per device index (runtime.launch)

    def bind(self, tensors: tuple, outputs: tuple, inputs: tuple) -> Launch:
        """This planned launch with a call's tensors."""
        return Launch(
            self.source, self.kernel, self.grid, self.block, self.smem, self.args, tensors, outputs, inputs,
            self.one_d_grid, self.index_64, self.max_offset, self.programmatic, self,
        )


def device_index(device: torch.device) -> int:
    """The CUDA device index of ``device`` (the current device for a bare ``"cuda"``)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@dataclass(frozen=True)
class DeviceLimits:
    sm_count: int
    max_threads: int
    smem_default: int
    smem_optin: int


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) byte range a tensor's elements occupy."""
    p = t.data_ptr()
    if t.is_contiguous():
        return (p, p + t.nbytes)
    if t.numel() == 0:
        return (p, p)
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (p, p + extent * t.element_size())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def validate(launch: Launch, limits: DeviceLimits) -> None:
    """Reject a launch that would be wrong or undefined on the device: its geometry and its outputs'
    overlap with its inputs. A prepared launch (:class:`Prepared`) checks the geometry once per
    device, and per call only the overlap of the outputs it is given."""
    _validate_geometry(launch, limits)
    check_overlap(launch.kernel, launch.outputs, launch.inputs)


def check_overlap(kernel: str, outputs: tuple, inputs: tuple) -> None:
    for out in outputs:
        o0, o1 = _span(out)
        for t in inputs:
            i0, i1 = _span(t)
            if o0 < i1 and i0 < o1:
                raise ValueError(f"{kernel}: an output overlaps an input (outputs must be fresh)")


def _validate_geometry(launch: Launch, limits: DeviceLimits) -> None:
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
_handles: dict[tuple[str, str, int], int] = {}  # the CUfunction of each compiled kernel
_contexts: dict[int, int] = {}  # device index -> the CUDA context CuPy loaded its modules in


@functools.lru_cache(maxsize=1)
def _driver():
    from cupy_backends.cuda.api import driver

    return driver


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
                _handles[key] = fn.kernel.ptr
                _contexts[device_index] = _driver().ctxGetCurrent()
            except Exception as err:  # CompileException, or a load failure
                log = err.get_message() if hasattr(err, "get_message") else str(err)
                raise CompileError(
                    f"conv1d_silu: NVRTC could not build {kernel} from {source}.cu "
                    f"(options {NVRTC_OPTIONS}, device {device_index}):\n{log}"
                ) from err
            _functions[key] = fn
            record_instance(source, kernel)
    return fn


def record_instance(source: str, kernel: str) -> None:
    """Append a compiled instance to :func:`config.record_instances`'s file, one ``source<TAB>name
    expression`` line (one write: processes appending at once do not interleave their lines). The
    suite compiles a thousand instances, one test after another; after a kernel-text change
    tools/warm_kernels.py compiles the last run's list on every core first."""
    path = config.record_instances()
    if path:
        with open(path, "a") as f:
            f.write(f"{source}\t{kernel}\n")


def current_stream_ptr(device_index: int) -> int:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


_smem_ready: dict[int, int] = {}  # id(kernel function) -> the dynamic shared memory it is prepared for


def _prepare_smem(fn, smem: int, device_index: int) -> None:
    """Raise the kernel's dynamic shared-memory limit when its dynamic and static shared memory
    together pass the 48 KB default: the default bounds their sum, so a launch of exactly 48 KB
    of dynamic memory beside a static variable fails (CUDA_ERROR_INVALID_VALUE) without it.
    Each size is checked once per kernel: the static size is a driver query, not for every launch."""
    if _smem_ready.get(id(fn), -1) >= smem:
        return
    if smem + getattr(fn, "shared_size_bytes", 0) > device_limits(device_index).smem_default:
        fn.max_dynamic_shared_size_bytes = smem
    _smem_ready[id(fn)] = smem


@functools.lru_cache(maxsize=4096)
def max_active_blocks(source: str, kernel: str, block: int, smem: int, device_index: int) -> int:
    """Resident CTAs per SM for this instantiation (persistent grids; the flat forward's wave fill)."""
    fn = function(source, kernel, device_index)
    _prepare_smem(fn, smem, device_index)
    return max(1, _driver().occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, smem))


def pack_args(spec: Launch) -> Params:
    """The launch's argument struct, with its tensors' addresses (:meth:`Args.packed`)."""
    return spec.args.packed(spec.tensors)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("value", ctypes.c_int32 * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
        ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint32),
    ]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


@functools.lru_cache(maxsize=1)
def _launch_kernel_ex():
    fn = _libcuda().cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=None)
def programmatic_launches(index: int) -> bool:
    """Whether a launch marked programmatic goes out as one: compute capability 9.0+ and a driver of
    CUDA 12.3 or later (whose stream capture keeps the programmatic edge in a graph). Otherwise it
    is a plain launch, which the kernels' griddepcontrol instructions treat alike."""
    if torch.cuda.get_device_capability(index)[0] < 9:
        return False
    version = ctypes.c_int(0)
    return _libcuda().cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value >= 12030


class Driver(NamedTuple):
    """The calls a prepared launch makes, with the CUDA driver's signatures: the CUDA driver on a GPU
    (:func:`cuda_driver`); the tests' CPU emulator and tools/host_profile.py pass stand-ins, so every
    step of a launch but these calls runs on any machine."""

    ctx_get_current: Callable[[], int]  # cuCtxGetCurrent
    stream: Callable[[int], int]  # the current stream of a device index (torch's)
    launch_kernel: Callable[..., object]  # cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
    launch_kernel_ex: Callable[..., int]  # cuLaunchKernelEx(config ref, f, params, extra) -> CUresult
    enter: Callable[[int], AbstractContextManager]  # makes a device's context current


@functools.lru_cache(maxsize=1)
def cuda_driver() -> Driver:
    """The CUDA driver: CuPy's binding, and ctypes for ``cuLaunchKernelEx`` (CuPy has none)."""
    driver = _driver()
    try:  # only programmatic launches (sm_90+) call it; elsewhere a missing libcuda.so.1 must not matter
        launch_ex = _launch_kernel_ex()
    except OSError:
        launch_ex = None
    return Driver(
        driver.ctxGetCurrent, current_stream_ptr if _raw_stream is None else _raw_stream, driver.launchKernel,
        launch_ex, _cupy().cuda.Device,
    )


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _ThreadParams:
    """A prepared launch's buffers in one thread: the argument struct (integer fields written once,
    the addresses by each call), the pointer to it that the driver takes, and for a programmatic
    launch its ``cuLaunchKernelEx`` configuration (geometry written once, the stream by each call)."""

    __slots__ = ("params", "slots", "pointers", "config", "config_ref", "attr")

    def __init__(self, prepared: Prepared):
        self.params = Params(prepared.launch.args._values)
        self.slots, self.pointers = self.params.slots, self.params.pointers_addr
        self.config = self.config_ref = self.attr = None
        if prepared.programmatic:
            self.attr = _LaunchAttribute(PROGRAMMATIC_STREAM_SERIALIZATION, 0)
            self.attr.value[0] = 1
            launch = prepared.launch
            self.config = _LaunchConfig(
                grid=launch.grid, block=(launch.block, 1, 1), smem=launch.smem, attrs=ctypes.pointer(self.attr),
                num_attrs=1,
            )
            self.config_ref = ctypes.byref(self.config)


class Prepared:
    """A planned launch made ready on one device, once: its geometry checked against the device's
    limits, the kernel compiled and its shared memory prepared, the driver's handle, context and
    programmatic decision looked up. A call (``prepared(tensors, outputs, inputs)``) checks the outputs
    given against the inputs for overlap, writes its tensors' addresses into this thread's argument
    struct and submits on the device's current stream: no launch object is built per call, and
    nothing planned is looked up again (a ``Launch`` bound, validated and packed per call cost 2.5 %
    more of an eager forward + backward's host time on the no-op launcher, without the lookups the
    GPU path made per launch besides).

    ``tensors`` follow ``launch.args.tensors`` (None where the plan has a null pointer); ``outputs`` are
    those the caller passed in (fresh allocations cannot overlap an input and are not checked).
    ``CONV1D_SILU_PROGRAMMATIC`` is read by every programmatic launch, so it can be set at any time."""

    __slots__ = (
        "launch", "index", "handle", "context", "programmatic", "driver", "_slots", "_local", "_geometry",
    )

    def __init__(
        self, launch: Launch, limits: DeviceLimits, index: int, handle, context: int, programmatic: bool,
        driver: Driver,
    ):
        _validate_geometry(launch, limits)
        self.launch, self.index, self.handle, self.context, self.driver = launch, index, handle, context, driver
        self.programmatic = launch.programmatic and programmatic
        # (field, position in a call's tensors) of each pointer field a call fills
        self._slots = launch.args._tensor_slots
        self._geometry = (*launch.grid, launch.block, 1, 1, launch.smem)
        self._local = threading.local()  # .t: this thread's _ThreadParams (freed with the thread)

    def __call__(self, tensors: tuple, outputs: tuple = (), inputs: tuple = (), entered: bool = False) -> None:
        if outputs:
            check_overlap(self.launch.kernel, outputs, inputs)
        try:
            t = self._local.t
        except AttributeError:
            t = self._local.t = _ThreadParams(self)
        slots = t.slots
        for slot, i in self._slots:
            slots[slot] = tensors[i].data_ptr()
        driver = self.driver
        if driver.ctx_get_current() != self.context and not entered:
            # the context CuPy loaded the kernel in, entered (torch's device guard makes it current);
            # the submission is inline below, not a function of its own: a call per launch
            with driver.enter(self.index):
                return self(tensors, entered=True)
        stream = driver.stream(self.index)
        if self.programmatic and config.programmatic_launches():
            t.config.stream = stream
            err = driver.launch_kernel_ex(t.config_ref, self.handle, t.pointers, None)
            if err:
                raise RuntimeError(f"conv1d_silu: cuLaunchKernelEx of {self.launch.kernel} failed with CUresult {err}")
        else:
            driver.launch_kernel(self.handle, *self._geometry, stream, t.pointers, 0)


def prepare(launch: Launch, device: torch.device) -> Prepared:
    """``launch`` (a planned launch) ready on ``device``'s GPU: compiled on first use, checked, its
    shared memory limit raised where needed (:class:`Prepared`)."""
    index = device_index(device)
    limits = device_limits(index)
    _validate_geometry(launch, limits)  # before compiling: a bad plan is refused with its reason, not a driver error
    fn = function(launch.source, launch.kernel, index)
    _prepare_smem(fn, launch.smem, index)
    return Prepared(
        launch, limits, index, _handles[(launch.source, launch.kernel, index)], _contexts[index],
        programmatic_launches(index), cuda_driver(),
    )


def launch(spec: Launch, device: torch.device) -> None:
    """Validate and launch a bound launch (:meth:`Launch.bind`) on the current stream of ``device``:
    its planned launch prepared once per device (:class:`Prepared`, kept on the planned launch), then
    called with the bound tensors.

    The launch goes straight to ``cuLaunchKernel`` with the packed parameters (CuPy's per-argument
    conversion costs more than the launch itself on a slow host), in the CUDA context CuPy loaded the
    kernel in: the caller's when it is current, as it is under torch's device guard, else entered.
    """
    planned = spec.planned or spec
    index = device_index(device)
    ready = planned.ready
    if ready is None:
        ready = planned.ready = {}
    prepared = ready.get(index)
    if prepared is None:
        prepared = ready[index] = prepare(planned, device)
    prepared(spec.tensors, spec.outputs, spec.inputs)


def cache_dir() -> str:
    """CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``)."""
    return os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))

