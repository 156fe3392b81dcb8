"""pynvml worker (nvidia-ml-py: NVML through ctypes, as nvidia-smi-like tools and dashboards use it)."""
import sys

from common import emit, run

import pynvml


def info():
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    emit(
        step="info",
        count=pynvml.nvmlDeviceGetCount(),
        name=pynvml.nvmlDeviceGetName(h),
        uuid=pynvml.nvmlDeviceGetUUID(h),
        driver=pynvml.nvmlSystemGetDriverVersion(),
        cuda_driver=pynvml.nvmlSystemGetCudaDriverVersion(),
        total=v1.total,
        used=v1.used,
        free=v1.free,
        v2_total=v2.total,
        v2_used=v2.used,
        v2_free=v2.free,
        procs=[[p.pid, p.usedGpuMemory] for p in procs],
    )
    pynvml.nvmlShutdown()


def lists():
    """Every list-shaped per-process call pynvml wraps: graphics and MPS lists, the detail list per mode."""
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = {
        "graphics": pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        "mps": pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h),
    }
    for name, mode in (
        ("detail_compute", pynvml.NVML_PROCESS_MODE_COMPUTE),
        ("detail_graphics", pynvml.NVML_PROCESS_MODE_GRAPHICS),
        ("detail_mps", pynvml.NVML_PROCESS_MODE_MPS),
    ):
        try:
            out[name] = pynvml.nvmlDeviceGetRunningProcessDetailList(h, pynvml.nvmlProcessDetailList_v1, mode)
        except pynvml.NVMLError_NotSupported:
            out[name] = []  # pre-Hopper GPUs
    emit(step="lists", **{k: [[p.pid, p.usedGpuMemory] for p in v] for k, v in out.items()})
    pynvml.nvmlShutdown()


run(sys.argv[1:], {"info": info, "lists": lists})
