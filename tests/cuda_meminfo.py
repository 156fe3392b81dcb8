# The device memory the CUDA driver API reports (cuMemGetInfo after a context on device 0), for
# tests/release.sh: "total_mib=N".
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p(); dev = ctypes.c_int(); free = ctypes.c_size_t(); total = ctypes.c_size_t()
assert cu.cuInit(0) == 0
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
print(f"total_mib={total.value >> 20}")
