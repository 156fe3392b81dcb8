//! NVML exports: the routing list, one line per exported entry point (see `abi::exports!`): its arguments (types
//! from `ffi::nvml`) and the hook it calls.

use crate::driver::nvml::NvmlTable;
use crate::ffi::nvml::*;
use crate::state::Shim;

fn table(s: &Shim) -> &NvmlTable {
    s.nvml.real()
}

crate::abi::exports! { nvml_guard, nvmlReturn_t, nvml, table, (call, real)
    // exported so that a bad configuration fails closed for NVML users too
    nvmlInit () => nvml::forward(call);
    nvmlInit_v2 () => nvml::forward(call);
    nvmlInitWithFlags (flags) => nvml::forward(call);
    nvmlDeviceGetMemoryInfo (device, memory) => nvml::memory_info(call, device, memory);
    nvmlDeviceGetMemoryInfo_v2 (device, memory) => nvml::memory_info(call, device, memory);
    nvmlDeviceGetComputeRunningProcesses (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetComputeRunningProcesses_v2 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetComputeRunningProcesses_v3 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetGraphicsRunningProcesses (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetGraphicsRunningProcesses_v2 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetGraphicsRunningProcesses_v3 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetMPSComputeRunningProcesses (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetMPSComputeRunningProcesses_v2 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetMPSComputeRunningProcesses_v3 (device, infoCount, infos) => nvml::running_processes(real, device, infoCount, infos);
    nvmlDeviceGetRunningProcessDetailList (device, plist) => nvml::process_detail_list(real, device, plist);
    nvmlDeviceGetProcessesUtilizationInfo (device, procesesUtilInfo) => nvml::processes_utilization_info(real, device, procesesUtilInfo);
    nvmlSystemGetProcessName (pid, name, length) => nvml::process_name(real, pid, name, length);
    nvmlDeviceGetAccountingPids (device, count, pids) => nvml::accounting_pids(real, device, count, pids);
    nvmlDeviceGetAccountingStats (device, pid, stats) => nvml::accounting_stats(real, device, pid, stats);
    nvmlDeviceGetProcessUtilization (device, utilization, processSamplesCount, lastSeenTimeStamp) => nvml::process_utilization(real, device, utilization, processSamplesCount, lastSeenTimeStamp);
    nvmlDeviceGetEncoderSessions (device, sessionCount, sessionInfos) => nvml::sessions(real, device, sessionCount, sessionInfos);
    nvmlDeviceGetFBCSessions (device, sessionCount, sessionInfo) => nvml::sessions(real, device, sessionCount, sessionInfo);
    // refused: they name other containers' processes or erase their records (hooks/nvml.rs says why)
    nvmlDeviceClearAccountingPids (device) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
    nvmlDeviceSetAccountingMode (device, mode) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
    nvmlVgpuInstanceGetEncoderSessions (vgpuInstance, sessionCount, sessionInfo) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
    nvmlVgpuInstanceGetFBCSessions (vgpuInstance, sessionCount, sessionInfo) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
    nvmlVgpuInstanceGetAccountingPids (vgpuInstance, count, pids) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
    nvmlVgpuInstanceGetAccountingStats (vgpuInstance, pid, stats) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
    nvmlVgpuInstanceClearAccountingPids (vgpuInstance) => nvml::refuse(nvmlReturn_t::ERROR_NO_PERMISSION);
    nvmlDeviceGetVgpuProcessUtilization (device, lastSeenTimeStamp, vgpuProcessSamplesCount, utilizationSamples) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
    nvmlDeviceGetVgpuProcessesUtilizationInfo (device, vgpuProcUtilInfo) => nvml::refuse(nvmlReturn_t::ERROR_NOT_SUPPORTED);
}
