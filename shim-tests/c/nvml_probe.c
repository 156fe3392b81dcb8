/* nvml_probe: what nvidia-smi and frameworks ask NVML, printed as key=value lines. Linked with -lnvidia-ml.
 *
 *   nvml_probe CMD...
 *   count           device count                                   count.rc= count=
 *   mem:I           nvmlDeviceGetMemoryInfo and _v2 of device I     mem.I.rc= .total= .used= .free=
 *                                                                   mem.I.v2.rc= .v2.total= .v2.used= .v2.free=
 *   procs:I         compute processes of device I through the bare, _v2 and _v3 entry points:
 *                   procs.I.vN.rc= procs.I.vN.count= procs.I.vN=<pid>:<bytes>,...
 *   putil:I         nvmlDeviceGetProcessUtilization of device I over the last second (size query, then a
 *                   buffer of 256): putil.I.query.rc= .query.count= putil.I.rc= putil.I.count=
 *                   putil.I=<pid>:<smUtil>,...
 *   uuid:I          uuid.I=
 *   wait            print ready=1, block until a line (or EOF) on stdin
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 256

static void print_list_v1(unsigned int i, nvmlReturn_t r, unsigned int n, const nvmlProcessInfo_v1_t *p) {
    printf("procs.%u.v1.rc=%d\nprocs.%u.v1.count=%u\nprocs.%u.v1=", i, (int)r, i, n, i);
    for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
        printf("%s%u:%llu", k ? "," : "", p[k].pid, p[k].usedGpuMemory);
    printf("\n");
}

static void print_list(unsigned int i, int v, nvmlReturn_t r, unsigned int n, const nvmlProcessInfo_t *p) {
    printf("procs.%u.v%d.rc=%d\nprocs.%u.v%d.count=%u\nprocs.%u.v%d=", i, v, (int)r, i, v, n, i, v);
    for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
        printf("%s%u:%llu", k ? "," : "", p[k].pid, p[k].usedGpuMemory);
    printf("\n");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    nvmlReturn_t r = nvmlInit_v2();
    printf("init=%d\n", (int)r);
    if (r != NVML_SUCCESS) return 1;
    for (int a = 1; a < argc; a++) {
        const char *c = argv[a];
        if (strcmp(c, "count") == 0) {
            unsigned int n = 0;
            r = nvmlDeviceGetCount_v2(&n);
            printf("count.rc=%d\ncount=%u\n", (int)r, n);
        } else if (strncmp(c, "mem:", 4) == 0) {
            unsigned int i = (unsigned int)atoi(c + 4);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("mem.%u.rc=%d\n", i, (int)r);
                continue;
            }
            nvmlMemory_t m;
            memset(&m, 0, sizeof m);
            r = nvmlDeviceGetMemoryInfo(d, &m);
            printf("mem.%u.rc=%d\nmem.%u.total=%llu\nmem.%u.used=%llu\nmem.%u.free=%llu\n", i, (int)r, i, m.total,
                   i, m.used, i, m.free);
            nvmlMemory_v2_t m2;
            memset(&m2, 0, sizeof m2);
            m2.version = nvmlMemory_v2;
            r = nvmlDeviceGetMemoryInfo_v2(d, &m2);
            printf("mem.%u.v2.rc=%d\nmem.%u.v2.total=%llu\nmem.%u.v2.used=%llu\nmem.%u.v2.free=%llu\n"
                   "mem.%u.v2.reserved=%llu\n",
                   i, (int)r, i, m2.total, i, m2.used, i, m2.free, i, m2.reserved);
        } else if (strncmp(c, "procs:", 6) == 0) {
            unsigned int i = (unsigned int)atoi(c + 6);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("procs.%u.rc=%d\n", i, (int)r);
                continue;
            }
            static nvmlProcessInfo_v1_t p1[MAXP];
            static nvmlProcessInfo_t p[MAXP];
            unsigned int n = MAXP;
            r = nvmlDeviceGetComputeRunningProcesses(d, &n, p1);
            print_list_v1(i, r, n, p1);
            n = MAXP;
            r = nvmlDeviceGetComputeRunningProcesses_v2(d, &n, (nvmlProcessInfo_v2_t *)p);
            print_list(i, 2, r, n, p);
            n = MAXP;
            r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p);
            print_list(i, 3, r, n, p);
            /* size query: count 0 + NULL must report the number needed */
            n = 0;
            r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL);
            printf("procs.%u.query.rc=%d\nprocs.%u.query.count=%u\n", i, (int)r, i, n);
        } else if (strncmp(c, "putil:", 6) == 0) {
            unsigned int i = (unsigned int)atoi(c + 6);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("putil.%u.rc=%d\n", i, (int)r);
                continue;
            }
            static nvmlProcessUtilizationSample_t u[MAXP];
            unsigned int n = 0;
            r = nvmlDeviceGetProcessUtilization(d, NULL, &n, 0);
            printf("putil.%u.query.rc=%d\nputil.%u.query.count=%u\n", i, (int)r, i, n);
            n = MAXP;
            r = nvmlDeviceGetProcessUtilization(d, u, &n, 0);
            printf("putil.%u.rc=%d\nputil.%u.count=%u\nputil.%u=", i, (int)r, i, n, i);
            for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
                printf("%s%u:%u", k ? "," : "", u[k].pid, u[k].smUtil);
            printf("\n");
        } else if (strncmp(c, "uuid:", 5) == 0) {
            unsigned int i = (unsigned int)atoi(c + 5);
            nvmlDevice_t d;
            char buf[96] = "";
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (!r) r = nvmlDeviceGetUUID(d, buf, sizeof buf);
            printf("uuid.%u.rc=%d\nuuid.%u=%s\n", i, (int)r, i, buf);
        } else if (strcmp(c, "wait") == 0) {
            printf("ready=1\n");
            fflush(stdout);
            char line[64];
            if (!fgets(line, sizeof line, stdin)) {
            }
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
    }
    printf("done=1\n");
    return 0;
}
