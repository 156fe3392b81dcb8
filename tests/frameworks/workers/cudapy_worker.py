"""cuda-python worker (cuda.bindings: the driver API as Python calls; see common.py for the protocol)."""
import os
import sys

from common import checkpoint, emit, now_ns, nvml_view, run

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

MiB = 1 << 20
held = []
state = {}


def check(result):
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err.name}")
    return rest[0] if len(rest) == 1 else rest


def context():
    if "ctx" not in state:
        check(cu.cuInit(0))
        dev = check(cu.cuDeviceGet(0))
        ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
        check(cu.cuCtxSetCurrent(ctx))
        state.update(dev=dev, ctx=ctx)
    return state["dev"]


def mem():
    free, total = check(cu.cuMemGetInfo())
    return {"free": free, "total": total, "reserved": sum(n for _, n in held)}


def info():
    dev = context()
    emit(step="info", device_total=check(cu.cuDeviceTotalMem(dev)), **mem())
    checkpoint("info")


def oom(chunk_mib):
    context()
    chunk = int(chunk_mib) * MiB
    err = None
    while len(held) < 100_000:
        err, p = cu.cuMemAlloc(chunk)
        if err != cu.CUresult.CUDA_SUCCESS:
            break
        held.append((p, chunk))
    emit(
        step="oom",
        chunk=chunk,
        chunks=len(held),
        error_type=f"CUresult.{err.name}",
        framework_oom=err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY,
        **mem(),
    )
    checkpoint("oom")


def hold(mib):
    context()
    n = int(mib) * MiB
    held.append((check(cu.cuMemAlloc(n)), n))
    emit(step="hold", **mem())
    checkpoint("hold")


def free():
    for p, _ in held:
        check(cu.cuMemFree(p))
    held.clear()
    emit(step="free", **mem())
    checkpoint("free")


def copy():
    context()
    src = np.tile(np.arange(256, dtype=np.uint8), 4096)
    n = src.nbytes
    a, b = check(cu.cuMemAlloc(n)), check(cu.cuMemAlloc(n))
    check(cu.cuMemcpyHtoD(a, src, n))
    check(cu.cuMemcpyDtoD(b, a, n))
    back, back2 = np.zeros_like(src), np.zeros_like(src)
    check(cu.cuMemcpyDtoH(back, a, n))
    check(cu.cuMemcpyDtoH(back2, b, n))
    stream = check(cu.cuStreamCreate(0))
    c = check(cu.cuMemAlloc(n))
    check(cu.cuMemcpyHtoDAsync(c, src, n, stream))
    back3 = np.zeros_like(src)
    check(cu.cuMemcpyDtoHAsync(back3, c, n, stream))
    check(cu.cuStreamSynchronize(stream))
    for p in (a, b, c):
        check(cu.cuMemFree(p))
    check(cu.cuStreamDestroy(stream))
    emit(
        step="copy",
        h2d_d2h=bool((back == src).all()),
        d2d=bool((back2 == src).all()),
        pinned_async=bool((back3 == src).all()),
    )


def procs():
    context()
    emit(step="procs", pid=os.getpid(), **nvml_view())
    checkpoint("procs")


def profiler():
    context()
    check(cu.cuProfilerStart())
    check(cu.cuProfilerStop())
    emit(step="profiler", ok=True)


KERNEL = b'extern "C" __global__ void inc(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }'


def kernel():
    """`inc`, compiled by NVRTC to PTX for compute_90 and loaded with cuModuleLoadData."""
    err, prog = nvrtc.nvrtcCreateProgram(KERNEL, b"inc.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_90"])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    err, = nvrtc.nvrtcGetPTX(prog, ptx)
    module = check(cu.cuModuleLoadData(ptx))
    return check(cu.cuModuleGetFunction(module, b"inc"))


def loop(n, blocks):
    context()
    f = kernel()
    blocks = int(blocks)
    count = blocks * 256
    x = check(cu.cuMemAlloc(count * 4))
    args = (np.array([int(x)], dtype=np.uint64), np.array([count], dtype=np.int32))
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)

    def launch():
        check(cu.cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, 0, params.ctypes.data, 0))

    for _ in range(100):  # warm-up outside the measured window; the throttle settles
        launch()
    check(cu.cuCtxSynchronize())
    t0 = now_ns()
    for _ in range(int(n)):
        launch()
    check(cu.cuCtxSynchronize())
    t1 = now_ns()
    emit(step="loop", launches=int(n), t0=t0, t1=t1, pid=os.getpid())
    checkpoint("loop")


run(
    sys.argv[1:],
    {
        "info": info,
        "oom": oom,
        "hold": hold,
        "free": free,
        "copy": copy,
        "procs": procs,
        "profiler": profiler,
        "loop": loop,
    },
)
