#!/usr/bin/env python3
"""A CUDA driver-API program with nothing to build: what size the GPU says it has, then 256 MiB allocations
until the device (or cuquota's cap) refuses one.

    cuquota run --memory 1g -- python3 examples/cuda_alloc.py

It reaches libcuda.so.1 with dlopen and dlsym (Python's ctypes), as the CUDA runtime and most frameworks do.
Signatures as in cuda.h (13.0): the _v2 entry points the header maps cuDeviceTotalMem, cuMemGetInfo,
cuMemAlloc and cuMemFree to.
"""

import ctypes
import sys

CHUNK = 256 << 20
MIB = 1 << 20


def main() -> int:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(f"cannot load libcuda.so.1: {e}", file=sys.stderr)
        return 2

    def err_name(rc: int) -> str:
        s = ctypes.c_char_p()
        if cuda.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {rc}"

    def check(what: str, rc: int) -> None:
        if rc != 0:
            print(f"{what}: {err_name(rc)}", file=sys.stderr)
            sys.exit(1)

    size_t = ctypes.c_size_t
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    check("cuInit", cuda.cuInit(0))
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    name = ctypes.create_string_buffer(256)
    check("cuDeviceGetName", cuda.cuDeviceGetName(name, 256, dev))
    total = size_t()
    check("cuDeviceTotalMem_v2", cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev))
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
    free, total2 = size_t(), size_t()
    check("cuMemGetInfo_v2", cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total2)))
    print(f"device: {name.value.decode()}")
    print(f"cuDeviceTotalMem: {total.value // MIB} MiB")
    print(f"cuMemGetInfo: {free.value // MIB} MiB free of {total2.value // MIB} MiB")

    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
    held = []
    limit = total.value // CHUNK + 1  # never more than the device says it has
    rc = 0
    while len(held) < limit:
        p = ctypes.c_ulonglong()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), CHUNK)
        if rc != 0:
            break
        held.append(p.value)
    print(f"allocated {len(held)} x {CHUNK // MIB} MiB = {len(held) * CHUNK // MIB} MiB, "
          f"then {err_name(rc) if rc else 'stopped at the device size'}")
    for p in held:
        cuda.cuMemFree_v2(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
