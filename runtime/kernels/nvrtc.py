"""CUDA C++ kernels built at run time: NVRTC compiles the source, the driver loads and launches it.

The plumbing of the hand-written kernels (mma_gemv.cu), apart from what they compute. Everything goes
through ctypes, so importing this module loads neither NVRTC nor the driver; the first build does.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from pathlib import Path

import torch

_PDL_ATTRIBUTE = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


@functools.cache
def compile_source(source: str, name: str, arch: str, options: tuple[str, ...]) -> bytes:
    """The cubin of `source` (called `name` in errors) for `arch` (sm_90) with `options` (-D macros)."""
    nvrtc = _nvrtc()
    program = ctypes.c_void_p()
    _check_nvrtc(
        nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None)
    )
    try:
        flags = [f"--gpu-architecture={arch}", "-std=c++17", *options]
        array = (ctypes.c_char_p * len(flags))(*(f.encode() for f in flags))
        if nvrtc.nvrtcCompileProgram(program, len(flags), array) != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise RuntimeError(f"{name} {' '.join(options)} did not compile:\n{log.value.decode()}")
        size = ctypes.c_size_t()
        _check_nvrtc(nvrtc, nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)))
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin))
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


@functools.cache
def kernel(
    device_index: int, source: Path, name: str, options: tuple[str, ...], dynamic_shared: int = 0
) -> ctypes.c_void_p:
    """Kernel `name` of the CUDA C++ file `source`, built with `options` for the device's architecture and
    loaded: once a process for each build. Its folder is on the include path (ptx.cuh)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    options = (*options, f"--include-path={source.parent}")
    cubin = compile_source(source.read_text(), source.name, f"sm_{major}{minor}", options)
    return load_function(device_index, cubin, name, dynamic_shared)


def load_function(device_index: int, cubin: bytes, name: str, dynamic_shared: int = 0) -> ctypes.c_void_p:
    """The kernel `name` of `cubin`, loaded into the device's primary context (torch's)."""
    cuda = driver()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream(device_index)  # the device's primary context, current on this thread
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        check(cuda.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        check(cuda.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
        if dynamic_shared:
            check(
                cuda.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED, dynamic_shared), "cuFuncSetAttribute"
            )
    return function


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


# The launch attribute a PDL launch passes, built once: programmaticStreamSerializationAllowed = 1.
_PDL = ctypes.pointer(_Attribute(_PDL_ATTRIBUTE, b"", (ctypes.c_ubyte * 64)(1)))


def launch(function, grid, block, shared_bytes: int, args, stream, pdl: bool = False) -> None:
    """cuLaunchKernelEx on `stream`. Arguments: a tensor passes its address, a ctypes value itself, an
    int a 32-bit int."""
    values = [_argument(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values))
    config = _Config(
        grid=(ctypes.c_uint * 3)(*grid),
        block=(ctypes.c_uint * 3)(*block),
        shared_bytes=shared_bytes,
        stream=ctypes.c_void_p(stream.cuda_stream),
        attrs=_PDL if pdl else None,
        num_attrs=1 if pdl else 0,
    )
    check(driver().cuLaunchKernelEx(ctypes.byref(config), function, params, None), "cuLaunchKernelEx")


def _argument(a):
    if isinstance(a, torch.Tensor):
        return ctypes.c_void_p(a.data_ptr())
    if isinstance(a, ctypes._SimpleCData):
        return a
    return ctypes.c_int(a)


@functools.cache
def driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    """NVRTC of the CUDA major torch was built with: the loader's, the nvidia-* wheels', or CUDA_HOME's."""
    major = (torch.version.cuda or "13").split(".")[0]
    names = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/lib64"]
    roots += [p for entry in sys.path for p in glob.glob(os.path.join(entry, "nvidia", "*", "lib"))]
    for candidate in names + [os.path.join(r, n) for r in roots for n in names]:
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    raise OSError(f"libnvrtc.so.{major} not found (tried the loader's path, CUDA_HOME and the nvidia wheels)")


def check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        driver().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({result})")


def _check_nvrtc(nvrtc: ctypes.CDLL, result: int) -> None:
    if result != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC error: {nvrtc.nvrtcGetErrorString(result).decode()}")
