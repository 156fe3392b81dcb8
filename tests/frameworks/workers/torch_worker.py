"""PyTorch worker (see common.py for the protocol). The allocator comes from PYTORCH_CUDA_ALLOC_CONF."""
import gc
import os
import sys

from common import checkpoint, emit, now_ns, nvml_view, run

import torch

MiB = 1 << 20
held = []


def mem():
    free, total = torch.cuda.mem_get_info()
    return {
        "free": free,
        "total": total,
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
    }


def info():
    emit(
        step="info",
        device_total=torch.cuda.get_device_properties(0).total_memory,
        name=torch.cuda.get_device_name(0),
        backend=torch.cuda.get_allocator_backend(),
        **mem(),
    )
    checkpoint("info")


def oom(chunk_mib):
    chunk = int(chunk_mib) * MiB
    err = None
    try:
        while len(held) < 100_000:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except Exception as e:  # the test checks which
        err = e
    emit(
        step="oom",
        chunk=chunk,
        chunks=len(held),
        error_type=f"{type(err).__module__}.{type(err).__qualname__}",
        framework_oom=isinstance(err, torch.OutOfMemoryError),
        message=str(err)[:400],
        **mem(),
    )
    checkpoint("oom")


def hold(mib):
    held.append(torch.empty(int(mib) * MiB, dtype=torch.uint8, device="cuda"))
    emit(step="hold", **mem())
    checkpoint("hold")


def meminfo():
    emit(step="meminfo", **mem())
    checkpoint("meminfo")


def free():
    held.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    emit(step="free", **mem())
    checkpoint("free")


def copy():
    src = torch.arange(256, dtype=torch.uint8).repeat(4096)  # 1 MiB, every byte value
    d = src.to("cuda")
    d2 = d.clone()  # device to device
    pinned = src.pin_memory()
    d3 = torch.empty_like(d)
    d3.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    emit(
        step="copy",
        h2d_d2h=bool(torch.equal(src, d.cpu())),
        d2d=bool(torch.equal(src, d2.cpu())),
        pinned_async=bool(torch.equal(src, d3.cpu())),
    )


def procs():
    emit(step="procs", pid=os.getpid(), listing=torch.cuda.list_gpu_processes(0), **nvml_view())
    checkpoint("procs")


def profiler():
    torch.cuda.profiler.start()
    torch.cuda.profiler.stop()
    emit(step="profiler", ok=True)


WARMUP = 100


def timed(kind, n, body):
    # Warm-up outside the measured window, as any benchmark: the first launch loads the kernel's module
    # (lazily, as CUDA does), and the throttle settles on the kernel's duration.
    for _ in range(WARMUP):
        body()
    torch.cuda.synchronize()
    t0 = now_ns()
    for _ in range(n):
        body()
    torch.cuda.synchronize()
    t1 = now_ns()
    emit(step=kind, launches=n, t0=t0, t1=t1, pid=os.getpid())
    checkpoint(kind)


def loop(n, elems):
    x = torch.ones(int(elems), device="cuda")
    timed("loop", int(n), lambda: x.add_(1.0))


def conv(n, batch="8", channels="3", size="64"):
    b, c, s = int(batch), int(channels), int(size)
    x = torch.ones(b, c, s, s, device="cuda")
    w = torch.ones(16 if c == 3 else c, c, 3, 3, device="cuda")
    timed("conv", int(n), lambda: torch.nn.functional.conv2d(x, w))


def matmul(n, size="256"):
    a = torch.ones(int(size), int(size), device="cuda")
    b = torch.ones(int(size), int(size), device="cuda")
    timed("matmul", int(n), lambda: a @ b)


# --- elastic memory: tensors the shim may move to host memory while the worker is idle ----------------------
model = []


def tensors(n, mib):
    """`n` float tensors of `mib` MiB each (>= 2 MiB: movable), filled from the host with known values, and an
    input buffer of the same size."""
    g = torch.Generator().manual_seed(39)
    elems = int(mib) * MiB // 4
    for _ in range(int(n) + 1):
        model.append(torch.rand(elems, generator=g).to("cuda"))
    torch.cuda.synchronize()
    emit(step="model", **mem())


def train(n):
    """`n` steps: a batch copied in (H2D), an update of every tensor (kernels), a tensor copied onto the next
    (D2D), so each step reads and writes memory that may have been evicted since the last one."""
    *w, x = model
    for i in range(int(n)):
        x.copy_(torch.full((x.numel(),), float(i + 1) / 8))
        for t in w:
            t.mul_(0.5).add_(x)
        w[(i + 1) % len(w)].copy_(w[i % len(w)])
    torch.cuda.synchronize()
    emit(step="train", steps=int(n), **mem())


def sums():
    import hashlib

    return [hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16] for t in model]


def idle():
    torch.cuda.synchronize()
    emit(step="idle", pid=os.getpid(), sums=sums(), **mem())
    checkpoint("idle")  # the test asks for the eviction here, and clears the ask before letting it go on


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
        "info": info,
        "oom": oom,
        "hold": hold,
        "meminfo": meminfo,
        "free": free,
        "copy": copy,
        "procs": procs,
        "profiler": profiler,
        "loop": loop,
        "conv": conv,
        "matmul": matmul,
    },
)
