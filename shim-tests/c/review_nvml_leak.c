/* Review (issue 21 item 9): per-process NVML calls whose "malformed" forms the shim forwards to the real
 * library unfiltered. A NULL buffer with a non-zero count is passed straight through (src/hooks/nvml.rs:
 * `infos.is_null() && *count > 0` → `real(...)`); the real function answers with the device-wide count.
 * Prints <call>.rc= <call>.count= for each, device 0. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
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
    n = 0;
    r = nvmlDeviceGetProcessUtilization(d, NULL, &n, 0);
    printf("putil.rc=%d\nputil.count=%u\n", (int)r, n);
    return 0;
}
