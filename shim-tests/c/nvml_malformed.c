/* Per-process NVML calls in the forms the shim must not forward to the real library unfiltered: a NULL buffer
 * with a non-zero count (the real function writes the device-wide count), a struct version the shim cannot
 * filter, and nvmlDeviceSetAccountingMode (disabling erases every process's records; looked up with dlsym,
 * "missing" when nothing exports it). Prints <call>.rc= <call>.count= for each, device 0. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>

int main(void) {
    if (nvmlInit_v2() != NVML_SUCCESS) return 1;
    nvmlDevice_t d;
    if (nvmlDeviceGetHandleByIndex_v2(0, &d) != NVML_SUCCESS) return 1;
    unsigned int n;
    nvmlReturn_t r;
    n = 1;
    r = nvmlDeviceGetEncoderSessions(d, &n, NULL);
    printf("enc.rc=%d\nenc.count=%u\n", (int)r, n);
    n = 1;
    r = nvmlDeviceGetFBCSessions(d, &n, NULL);
    printf("fbc.rc=%d\nfbc.count=%u\n", (int)r, n);
    n = 1;
    r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL);
    printf("procs.rc=%d\nprocs.count=%u\n", (int)r, n);
    n = 1;
    r = nvmlDeviceGetAccountingPids(d, &n, NULL);
    printf("acct.rc=%d\nacct.count=%u\n", (int)r, n);

    nvmlProcessDetail_v1_t procs[64];
    nvmlProcessDetailList_t dl = {0};
    dl.version = (unsigned int)(sizeof(nvmlProcessDetailList_v1_t) | (2u << 24));
    dl.numProcArrayEntries = 64;
    dl.procArray = procs;
    r = nvmlDeviceGetRunningProcessDetailList(d, &dl);
    printf("detail_v2.rc=%d\n", (int)r);
    nvmlProcessUtilizationInfo_v1_t samples[64];
    nvmlProcessesUtilizationInfo_t ui = {0};
    ui.version = (unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (2u << 24));
    ui.processSamplesCount = 64;
    ui.procUtilArray = samples;
    r = nvmlDeviceGetProcessesUtilizationInfo(d, &ui);
    printf("putil_v2.rc=%d\n", (int)r);

    nvmlReturn_t (*set_mode)(nvmlDevice_t, nvmlEnableState_t) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlEnableState_t))dlsym(RTLD_DEFAULT, "nvmlDeviceSetAccountingMode");
    if (set_mode)
        printf("setacct.rc=%d\n", (int)set_mode(d, NVML_FEATURE_DISABLED));
    else
        printf("setacct.rc=missing\n");
    return 0;
}
