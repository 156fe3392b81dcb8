"""CuPy worker (see common.py for the protocol): CuPy's memory pool and its NVRTC-compiled kernels."""
import gc
import os
import sys

from common import checkpoint, emit, now_ns, nvml_view, run

import cupy as cp
import numpy as np

MiB = 1 << 20
held = []
pool = cp.get_default_memory_pool()


def mem():
    free, total = cp.cuda.runtime.memGetInfo()
    return {"free": free, "total": total, "reserved": pool.total_bytes(), "allocated": pool.used_bytes()}


def info():
    props = cp.cuda.runtime.getDeviceProperties(0)
    dev_free, dev_total = cp.cuda.Device(0).mem_info
    emit(step="info", device_total=props["totalGlobalMem"], device_free=dev_free, name=props["name"].decode(), **mem())
    checkpoint("info")


def oom(chunk_mib):
    chunk = int(chunk_mib) * MiB
    err = None
    try:
        while len(held) < 100_000:
            held.append(cp.empty(chunk, dtype=cp.uint8))
    except Exception as e:
        err = e
    emit(
        step="oom",
        chunk=chunk,
        chunks=len(held),
        error_type=f"{type(err).__module__}.{type(err).__qualname__}",
        framework_oom=isinstance(err, cp.cuda.memory.OutOfMemoryError),
        message=str(err)[:400],
        **mem(),
    )
    checkpoint("oom")


def free():
    held.clear()
    gc.collect()
    cp.cuda.Device(0).synchronize()
    pool.free_all_blocks()
    emit(step="free", **mem())
    checkpoint("free")


def copy():
    src = np.tile(np.arange(256, dtype=np.uint8), 4096)
    d = cp.asarray(src)
    d2 = cp.empty_like(d)
    d2.data.copy_from_device(d.data, d.nbytes)  # device to device
    pinned = cp.cuda.alloc_pinned_memory(src.nbytes)
    host = np.frombuffer(pinned, np.uint8, src.size)
    host[:] = src
    d3 = cp.empty_like(d)
    d3.set(host, stream=cp.cuda.Stream.null)
    cp.cuda.Stream.null.synchronize()
    emit(
        step="copy",
        h2d_d2h=bool((cp.asnumpy(d) == src).all()),
        d2d=bool((cp.asnumpy(d2) == src).all()),
        pinned_async=bool((d3.get() == src).all()),
    )


def procs():
    cp.cuda.runtime.memGetInfo()  # a context
    emit(step="procs", pid=os.getpid(), **nvml_view())
    checkpoint("procs")


def profiler():
    cp.cuda.profiler.start()
    cp.cuda.profiler.stop()
    emit(step="profiler", ok=True)


def loop(n, elems):
    x = cp.ones(int(elems), dtype=cp.float32)
    for _ in range(100):  # warm-up: compiles (NVRTC) and loads the kernel; the throttle settles
        x += 1
    cp.cuda.Device(0).synchronize()
    t0 = now_ns()
    for _ in range(int(n)):
        x += 1
    cp.cuda.Device(0).synchronize()
    t1 = now_ns()
    emit(step="loop", launches=int(n), t0=t0, t1=t1, pid=os.getpid())
    checkpoint("loop")


# --- elastic memory: arrays the shim may move to host memory while the worker is idle (see torch_worker) ---
model = []


def tensors(n, mib):
    rng = np.random.default_rng(39)
    elems = int(mib) * MiB // 4
    for _ in range(int(n) + 1):
        model.append(cp.asarray(rng.random(elems, dtype=np.float32)))
    cp.cuda.Device(0).synchronize()
    emit(step="model", **mem())


def train(n):
    *w, x = model
    for i in range(int(n)):
        x.set(np.full(x.size, (i + 1) / 8, dtype=np.float32))
        for t in w:
            t *= 0.5
            t += x
        src, dst = w[i % len(w)], w[(i + 1) % len(w)]
        dst.data.copy_from_device(src.data, src.nbytes)  # a D2D copy, not a kernel
    cp.cuda.Device(0).synchronize()
    emit(step="train", steps=int(n), **mem())


def sums():
    import hashlib

    return [hashlib.sha256(cp.asnumpy(t).tobytes()).hexdigest()[:16] for t in model]


def idle():
    cp.cuda.Device(0).synchronize()
    emit(step="idle", pid=os.getpid(), sums=sums(), **mem())
    checkpoint("idle")


def result():
    emit(step="result", sums=sums(), **mem())
    checkpoint("result")


run(
    sys.argv[1:],
    {
        "tensors": tensors,
        "train": train,
        "idle": idle,
        "result": result,
        "info": info, "oom": oom, "free": free, "copy": copy, "procs": procs, "profiler": profiler, "loop": loop},
)
