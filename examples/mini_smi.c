// mini_smi: a minimal nvidia-smi on NVML. Loads libnvidia-ml.so.1 with dlopen/dlsym as monitoring tools do (so an
// interposed dlsym sees the lookups), then lists devices, memory (v1 and v2 structs), running compute processes
// and utilisation. Prints `metric gpu<i>.<field>=` lines for validate.sh.
//
//   mini_smi [expected_min_processes]
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nvml.h>

static int failures = 0;

static void check(const char *name, const char *expected, int ok, const char *observed) {
    printf("check %s: expected %s observed %s %s\n", name, expected, observed, ok ? "OK" : "FAIL");
    if (!ok) failures++;
}

static void *lib;
static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("check dlsym_%s: expected found observed missing FAIL\n", name);
        exit(2);
    }
    return p;
}

#define NVML_TRY(call)                                                                        \
    do {                                                                                      \
        nvmlReturn_t r_ = (call);                                                             \
        if (r_ != NVML_SUCCESS) {                                                             \
            printf("check %s: expected NVML_SUCCESS observed %d FAIL\n", #call, (int)r_);     \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

int main(int argc, char **argv) {
    unsigned min_procs = argc > 1 ? (unsigned)atoi(argv[1]) : 0;
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("check dlopen_libnvidia-ml: expected loaded observed %s FAIL\n", dlerror());
        return 2;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))sym("nvmlInit_v2");
    nvmlReturn_t (*shutdown)(void) = (nvmlReturn_t(*)(void))sym("nvmlShutdown");
    nvmlReturn_t (*count)(unsigned *) = (nvmlReturn_t(*)(unsigned *))sym("nvmlDeviceGetCount_v2");
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))sym("nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*get_name)(nvmlDevice_t, char *, unsigned) =
        (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))sym("nvmlDeviceGetName");
    nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned) =
        (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))sym("nvmlDeviceGetUUID");
    nvmlReturn_t (*mem1)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))sym("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))sym("nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))sym("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlUtilization_t *))sym("nvmlDeviceGetUtilizationRates");
    char (*err)(nvmlReturn_t) = NULL;
    (void)err;

    NVML_TRY(init());
    unsigned n = 0;
    NVML_TRY(count(&n));
    printf("metric devices=%u\n", n);
    char obs[160], exp[160];
    snprintf(obs, sizeof obs, "%u", n);
    check("device_count", ">=1", n >= 1, obs);
    printf("+-----+------------------------------------------+-----------------+-----------------+------+\n");
    printf("| GPU | name / uuid                              | memory used MiB | memory total MiB | util |\n");
    printf("+-----+------------------------------------------+-----------------+-----------------+------+\n");
    unsigned total_procs = 0;
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        NVML_TRY(by_index(i, &d));
        char name[96] = {0}, uuid[96] = {0};
        NVML_TRY(get_name(d, name, sizeof name));
        NVML_TRY(get_uuid(d, uuid, sizeof uuid));
        nvmlMemory_t m1;
        NVML_TRY(mem1(d, &m1));
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        NVML_TRY(mem2(d, &m2));
        nvmlUtilization_t u = {0, 0};
        nvmlReturn_t ur = util(d, &u);
        printf("| %3u | %-40.40s | %15llu | %16llu | %3u%% |\n", i, name, m1.used >> 20, m1.total >> 20,
               ur == NVML_SUCCESS ? u.gpu : 0);
        printf("|     | %-40.40s |                 |                  |      |\n", uuid);
        printf("metric gpu%u.memory_total=%llu\nmetric gpu%u.memory_used=%llu\nmetric gpu%u.memory_free=%llu\n", i,
               m1.total, i, m1.used, i, m1.free);
        printf("metric gpu%u.utilization=%u\n", i, ur == NVML_SUCCESS ? u.gpu : 0);
        snprintf(obs, sizeof obs, "used %llu + free %llu vs total %llu", m1.used, m1.free, m1.total);
        check("memory_v1_adds_up", "used+free<=total", m1.used + m1.free <= m1.total, obs);
        snprintf(exp, sizeof exp, "total %llu", m1.total);
        snprintf(obs, sizeof obs, "total %llu", m2.total);
        check("memory_v2_total_matches_v1", exp, m2.total == m1.total, obs);

        nvmlProcessInfo_t p[64];
        unsigned np = 64;
        nvmlReturn_t pr = procs(d, &np, p);
        if (pr != NVML_SUCCESS) np = 0;
        total_procs += np;
        for (unsigned k = 0; k < np; k++)
            printf("|     |   pid %-10u %12llu MiB              |                 |                  |      |\n",
                   p[k].pid, p[k].usedGpuMemory >> 20);
        printf("metric gpu%u.processes=%u\n", i, np);
    }
    printf("+-----+------------------------------------------+-----------------+-----------------+------+\n");
    snprintf(exp, sizeof exp, ">=%u", min_procs);
    snprintf(obs, sizeof obs, "%u", total_procs);
    check("compute_processes", exp, total_procs >= min_procs, obs);
    NVML_TRY(shutdown());
    printf("sample mini_smi: %s (%d failed checks)\n", failures ? "FAIL" : "OK", failures);
    return failures ? 1 : 0;
}
