"""The observer: runs beside the workers, never under cuquota, and reports the driver's ground truth as NVML
gives it to a node-side monitor (every process, the whole device). On the simulator it also reads the
device timeline: `observe.py BUSY PID T0 T1` prints the ns process PID occupied device 0 in [T0, T1)
(cudasimDeviceBusyNs, exact; NVML's utilisation is whole percentages)."""
import ctypes
import json
import sys

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
mem = pynvml.nvmlDeviceGetMemoryInfo(h)
out = {
    "device_total": mem.total,
    "device_used": mem.used,
    "procs": {str(p.pid): p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)},
}
if len(sys.argv) == 5 and sys.argv[1] == "BUSY":
    lib = ctypes.CDLL("libnvidia-ml.so.1")  # already loaded by pynvml: the same library
    f = lib.cudasimDeviceBusyNs
    f.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
    busy = ctypes.c_uint64()
    rc = f(0, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), ctypes.byref(busy))
    if rc != 0:
        sys.exit(f"cudasimDeviceBusyNs returned {rc}")
    out["busy_ns"] = busy.value
pynvml.nvmlShutdown()
print(json.dumps(out))
