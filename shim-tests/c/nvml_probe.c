/* nvml_probe: what nvidia-smi and frameworks ask NVML, printed as key=value lines. Linked with -lnvidia-ml.
 *
 *   nvml_probe CMD...
 *   count           device count                                   count.rc= count=
 *   mem:I           nvmlDeviceGetMemoryInfo and _v2 of device I     mem.I.rc= .total= .used= .free=
 *                                                                   mem.I.v2.rc= .v2.total= .v2.used= .v2.free=
 *   procs:I         compute processes of device I through the bare, _v2 and _v3 entry points:
 *                   procs.I.vN.rc= procs.I.vN.count= procs.I.vN=<pid>:<bytes>,...
 *   gprocs:I        the same for graphics processes (nvmlDeviceGetGraphicsRunningProcesses*): gprocs.I.vN...
 *   mprocs:I        the same for MPS compute processes (nvmlDeviceGetMPSComputeRunningProcesses*): mprocs.I.vN...
 *   acct:I          accounting pids of device I (size query, then a buffer of 256): acct.I.mode.rc= .mode=
 *                   acct.I.query.rc= acct.I.query.count= acct.I.rc= acct.I.count= acct.I=<pid>:0,...
 *   acctstat:I:P    nvmlDeviceGetAccountingStats of pid P: acctstat.I.P.rc= acctstat.I.P.mem= .running=
 *   detail:I:M      nvmlDeviceGetRunningProcessDetailList of device I in mode M (0 compute, 1 graphics, 2 MPS): size
 *                   query (0 + NULL) then an array of 256: detail.I.M.query.rc= .query.count= detail.I.M.rc=
 *                   detail.I.M.count= detail.I.M=<pid>:<bytes>,...
 *   pname:P         nvmlSystemGetProcessName of pid P: pname.P.rc= pname.P=
 *   putil:I         nvmlDeviceGetProcessUtilization of device I over the last second (size query, then a
 *                   buffer of 256): putil.I.query.rc= .query.count= putil.I.rc= putil.I.count=
 *                   putil.I=<pid>:<smUtil>,...
 *   putil2:I        nvmlDeviceGetProcessesUtilizationInfo (v1) of device I over the last second (size query with a NULL
 *                   array, then an array of 256): putil2.I.query.rc= .query.count= putil2.I.rc= putil2.I.count=
 *                   putil2.I=<pid>:<smUtil>,...
 *   enc:I           nvmlDeviceGetEncoderSessions of device I (size query: count 0 and NULL, then a buffer of 256):
 *                   enc.I.query.rc= enc.I.query.count= enc.I.rc= enc.I.count= enc.I=<pid>:<sessionId>,...
 *   fbc:I           the same for nvmlDeviceGetFBCSessions: fbc.I...
 *   vgpu:I          the vGPU per-process calls and the accounting clears, looked up with dlsym (the simulator has
 *                   none): vgpu.<name>.rc= (-1 = no such symbol)
 *   uuid:I          uuid.I=
 *   wait            print ready=1, block until a line (or EOF) on stdin
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 256

static void print_list_v1(const char *what, unsigned int i, nvmlReturn_t r, unsigned int n,
                          const nvmlProcessInfo_v1_t *p) {
    printf("%s.%u.v1.rc=%d\n%s.%u.v1.count=%u\n%s.%u.v1=", what, i, (int)r, what, i, n, what, i);
    for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
        printf("%s%u:%llu", k ? "," : "", p[k].pid, p[k].usedGpuMemory);
    printf("\n");
}

static void print_list(const char *what, unsigned int i, int v, nvmlReturn_t r, unsigned int n,
                       const nvmlProcessInfo_t *p) {
    printf("%s.%u.v%d.rc=%d\n%s.%u.v%d.count=%u\n%s.%u.v%d=", what, i, v, (int)r, what, i, v, n, what, i, v);
    for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
        printf("%s%u:%llu", k ? "," : "", p[k].pid, p[k].usedGpuMemory);
    printf("\n");
}

typedef nvmlReturn_t (*list_v1_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
typedef nvmlReturn_t (*list_v2_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v2_t *);
typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

/* One process list through its bare, _v2 and _v3 entry points, then a size query (count 0, NULL buffer) and a
 * buffer one short of the size the query reported. */
static void procs(const char *what, int idx, list_v1_fn f1, list_v2_fn f2, list_fn f3) {
    unsigned int i = (unsigned int)idx;
    nvmlDevice_t d;
    nvmlReturn_t r = nvmlDeviceGetHandleByIndex_v2(i, &d);
    if (r) {
        printf("%s.%u.rc=%d\n", what, i, (int)r);
        return;
    }
    static nvmlProcessInfo_v1_t p1[MAXP];
    static nvmlProcessInfo_t p[MAXP];
    unsigned int n = MAXP;
    r = f1(d, &n, p1);
    print_list_v1(what, i, r, n, p1);
    n = MAXP;
    r = f2(d, &n, (nvmlProcessInfo_v2_t *)p);
    print_list(what, i, 2, r, n, p);
    n = MAXP;
    r = f3(d, &n, p);
    print_list(what, i, 3, r, n, p);
    /* size query: count 0 + NULL must report the number needed */
    n = 0;
    r = f3(d, &n, NULL);
    printf("%s.%u.query.rc=%d\n%s.%u.query.count=%u\n", what, i, (int)r, what, i, n);
    if (n > 0) {
        unsigned int want = n;
        n = want - 1;
        memset(p, 0, sizeof p);
        r = f3(d, &n, p);
        printf("%s.%u.short.rc=%d\n%s.%u.short.count=%u\n", what, i, (int)r, what, i, n);
    }
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
            procs("procs", atoi(c + 6), nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2,
                  nvmlDeviceGetComputeRunningProcesses_v3);
        } else if (strncmp(c, "gprocs:", 7) == 0) {
            procs("gprocs", atoi(c + 7), nvmlDeviceGetGraphicsRunningProcesses,
                  nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses_v3);
        } else if (strncmp(c, "mprocs:", 7) == 0) {
            procs("mprocs", atoi(c + 7), nvmlDeviceGetMPSComputeRunningProcesses,
                  nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlDeviceGetMPSComputeRunningProcesses_v3);
        } else if (strncmp(c, "acct:", 5) == 0) {
            unsigned int i = (unsigned int)atoi(c + 5);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("acct.%u.rc=%d\n", i, (int)r);
                continue;
            }
            nvmlEnableState_t mode = NVML_FEATURE_DISABLED;
            r = nvmlDeviceGetAccountingMode(d, &mode);
            printf("acct.%u.mode.rc=%d\nacct.%u.mode=%d\n", i, (int)r, i, (int)mode);
            unsigned int n = 0;
            r = nvmlDeviceGetAccountingPids(d, &n, NULL);
            printf("acct.%u.query.rc=%d\nacct.%u.query.count=%u\n", i, (int)r, i, n);
            static unsigned int pids[MAXP];
            n = MAXP;
            r = nvmlDeviceGetAccountingPids(d, &n, pids);
            printf("acct.%u.rc=%d\nacct.%u.count=%u\nacct.%u=", i, (int)r, i, n, i);
            for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++) printf("%s%u:0", k ? "," : "", pids[k]);
            printf("\n");
        } else if (strncmp(c, "enc:", 4) == 0 || strncmp(c, "fbc:", 4) == 0) {
            int enc = c[0] == 'e';
            const char *what = enc ? "enc" : "fbc";
            unsigned int i = (unsigned int)atoi(c + 4);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("%s.%u.rc=%d\n", what, i, (int)r);
                continue;
            }
            static nvmlEncoderSessionInfo_t es[MAXP];
            static nvmlFBCSessionInfo_t fs[MAXP];
            unsigned int n = 0;
            r = enc ? nvmlDeviceGetEncoderSessions(d, &n, NULL) : nvmlDeviceGetFBCSessions(d, &n, NULL);
            printf("%s.%u.query.rc=%d\n%s.%u.query.count=%u\n", what, i, (int)r, what, i, n);
            n = MAXP;
            r = enc ? nvmlDeviceGetEncoderSessions(d, &n, es) : nvmlDeviceGetFBCSessions(d, &n, fs);
            printf("%s.%u.rc=%d\n%s.%u.count=%u\n%s.%u=", what, i, (int)r, what, i, n, what, i);
            for (unsigned int k = 0; r == NVML_SUCCESS && k < n; k++)
                printf("%s%u:%u", k ? "," : "", enc ? es[k].pid : fs[k].pid, enc ? es[k].sessionId : fs[k].sessionId);
            printf("\n");
        } else if (strncmp(c, "vgpu:", 5) == 0) {
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2((unsigned int)atoi(c + 5), &d);
            static nvmlEncoderSessionInfo_t es[MAXP];
            static nvmlFBCSessionInfo_t fs[MAXP];
            static unsigned int pids[MAXP];
            static nvmlVgpuProcessUtilizationSample_t vs[MAXP];
            nvmlAccountingStats_t st;
            nvmlVgpuProcessesUtilizationInfo_t vi;
            memset(&vi, 0, sizeof vi);
            unsigned int n;
#define VGPU(name, ...)                                                                                         \
    do {                                                                                                        \
        void *f = dlsym(RTLD_DEFAULT, #name);                                                                   \
        n = MAXP;                                                                                               \
        printf("vgpu.%s.rc=%d\n", #name, f ? (int)((__typeof__(&name))f)(__VA_ARGS__) : -1);                   \
    } while (0)
            VGPU(nvmlVgpuInstanceGetEncoderSessions, 1, &n, es);
            VGPU(nvmlVgpuInstanceGetFBCSessions, 1, &n, fs);
            VGPU(nvmlVgpuInstanceGetAccountingPids, 1, &n, pids);
            VGPU(nvmlVgpuInstanceGetAccountingStats, 1, 1, &st);
            VGPU(nvmlDeviceGetVgpuProcessUtilization, d, 0, &n, vs);
            VGPU(nvmlDeviceGetVgpuProcessesUtilizationInfo, d, &vi);
            VGPU(nvmlDeviceClearAccountingPids, d);
            VGPU(nvmlVgpuInstanceClearAccountingPids, 1);
#undef VGPU
        } else if (strncmp(c, "acctstat:", 9) == 0) {
            unsigned int i = 0, pid = 0;
            if (sscanf(c + 9, "%u:%u", &i, &pid) != 2) {
                printf("acctstat.usage=acctstat:I:PID\n");
                continue;
            }
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            nvmlAccountingStats_t st;
            memset(&st, 0, sizeof st);
            if (!r) r = nvmlDeviceGetAccountingStats(d, pid, &st);
            printf("acctstat.%u.%u.rc=%d\nacctstat.%u.%u.mem=%llu\nacctstat.%u.%u.running=%u\n", i, pid, (int)r, i,
                   pid, st.maxMemoryUsage, i, pid, st.isRunning);
        } else if (strncmp(c, "detail:", 7) == 0) {
            unsigned int i = 0, mode = 0;
            if (sscanf(c + 7, "%u:%u", &i, &mode) != 2) {
                printf("detail.usage=detail:I:MODE\n");
                continue;
            }
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("detail.%u.%u.rc=%d\n", i, mode, (int)r);
                continue;
            }
            static nvmlProcessDetail_v1_t pd[MAXP];
            nvmlProcessDetailList_t pl;
            memset(&pl, 0, sizeof pl);
            pl.version = nvmlProcessDetailList_v1;
            pl.mode = mode;
            r = nvmlDeviceGetRunningProcessDetailList(d, &pl);
            printf("detail.%u.%u.query.rc=%d\ndetail.%u.%u.query.count=%u\n", i, mode, (int)r, i, mode,
                   pl.numProcArrayEntries);
            pl.numProcArrayEntries = MAXP;
            pl.procArray = pd;
            r = nvmlDeviceGetRunningProcessDetailList(d, &pl);
            printf("detail.%u.%u.rc=%d\ndetail.%u.%u.count=%u\ndetail.%u.%u=", i, mode, (int)r, i, mode,
                   pl.numProcArrayEntries, i, mode);
            for (unsigned int k = 0; r == NVML_SUCCESS && k < pl.numProcArrayEntries; k++)
                printf("%s%u:%llu", k ? "," : "", pd[k].pid, pd[k].usedGpuMemory);
            printf("\n");
        } else if (strncmp(c, "pname:", 6) == 0) {
            unsigned int pid = (unsigned int)strtoul(c + 6, NULL, 10);
            char name[256] = "";
            r = nvmlSystemGetProcessName(pid, name, sizeof name);
            printf("pname.%u.rc=%d\npname.%u=%s\n", pid, (int)r, pid, r == NVML_SUCCESS ? name : "");
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
        } else if (strncmp(c, "putil2:", 7) == 0) {
            unsigned int i = (unsigned int)atoi(c + 7);
            nvmlDevice_t d;
            r = nvmlDeviceGetHandleByIndex_v2(i, &d);
            if (r) {
                printf("putil2.%u.rc=%d\n", i, (int)r);
                continue;
            }
            static nvmlProcessUtilizationInfo_v1_t u[MAXP];
            nvmlProcessesUtilizationInfo_t info;
            memset(&info, 0, sizeof info);
            info.version = nvmlProcessesUtilizationInfo_v1;
            r = nvmlDeviceGetProcessesUtilizationInfo(d, &info);
            printf("putil2.%u.query.rc=%d\nputil2.%u.query.count=%u\n", i, (int)r, i, info.processSamplesCount);
            info.processSamplesCount = MAXP;
            info.procUtilArray = u;
            r = nvmlDeviceGetProcessesUtilizationInfo(d, &info);
            printf("putil2.%u.rc=%d\nputil2.%u.count=%u\nputil2.%u=", i, (int)r, i, info.processSamplesCount, i);
            for (unsigned int k = 0; r == NVML_SUCCESS && k < info.processSamplesCount; k++)
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
