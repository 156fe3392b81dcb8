/* Link-time stand-in for libnvidia-ml.so: gives nvml_probe a DT_NEEDED of libnvidia-ml.so.1, as a program
 * linked against the real NVML has. Never loaded at run time (the simulator's libnvidia-ml.so.1 is). */
#define STUB(name) int name(void) { return 999; }
STUB(nvmlInit_v2)
STUB(nvmlShutdown)
STUB(nvmlDeviceGetCount_v2)
STUB(nvmlDeviceGetHandleByIndex_v2)
STUB(nvmlDeviceGetMemoryInfo)
STUB(nvmlDeviceGetMemoryInfo_v2)
STUB(nvmlDeviceGetComputeRunningProcesses)
STUB(nvmlDeviceGetComputeRunningProcesses_v2)
STUB(nvmlDeviceGetComputeRunningProcesses_v3)
STUB(nvmlDeviceGetUUID)
STUB(nvmlDeviceGetProcessUtilization)
