/* ipc_shared: memory shared between two processes with CUDA IPC, as a hostile tenant uses it (#11 class 1).
 * cuda.h calls cuMemFree of exported memory before the importers close it undefined; a driver that counts
 * references keeps it alive for the importer. A shim that un-charges at the exporter's cuMemFree lets the
 * container allocate the same memory again while the importer still holds it.
 *
 *   ipc_shared CMD...   forks an importer (re-executed, so it loads its own libraries; with
 *                       CQ_IMPORTER_USAGE_FILE set it runs in that container) and runs CMD on the primary
 *                       context of device 0 of the exporter; every command prints key=value lines:
 *     alloc:I:SIZE      exporter: cuMemAlloc of SIZE (k/m/g) into slot I, written to         alloc.I=<result>
 *     export:I          exporter: cuIpcGetMemHandle of slot I                                export.I=<result>
 *     free:I            exporter: cuMemFree of slot I                                          free.I=<result>
 *     open:I            importer: cuIpcOpenMemHandle of slot I's handle, reads a byte      open=<result> read=0|1
 *     close             importer: cuIpcCloseMemHandle of its last open                           close=<result>
 *     ialloc:SIZE       importer: cuMemAlloc (kept until exit)                                   ialloc=<result>
 *     used              the simulator's own used bytes on device 0 (NVML, past any interposer)     used=
 *     charged           exporter's cuMemGetInfo total − free: what the shim charged its container  charged=
 *   and done=1 at the end.
 */
#include "cq_driver.h"
#include <sys/wait.h>
#include <unistd.h>

#define SLOTS 16
static CUdeviceptr ptrs[SLOTS];
static CUipcMemHandle handles[SLOTS];

static int slot(const char *s) {
    int i = atoi(s);
    if (i < 0 || i >= SLOTS) {
        fprintf(stderr, "ipc_shared: slot %d out of range\n", i);
        exit(2);
    }
    return i;
}

static int context(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "ipc_shared: no context\n");
        return 2;
    }
    return 0;
}

/* The importer: reads one command letter (+ a handle for 'o') at a time, answers with a byte when done. */
static int importer(int in, int out) {
    if (context()) return 2;
    CUdeviceptr opened[SLOTS];
    int n = 0;
    for (;;) {
        char c = 0;
        if (read(in, &c, 1) != 1 || c == 'q') break;
        if (c == 'o') {
            CUipcMemHandle h;
            if (read(in, &h, sizeof h) != sizeof h) return 2;
            CUdeviceptr p = 0;
            CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            unsigned char b = 0;
            int ok = !r && !cuMemcpyDtoH(&b, p, 1) && b == 0x5a;
            if (!r && n < SLOTS) opened[n++] = p;
            printf("open=%s\nread=%d\n", cq_err(r), ok);
        } else if (c == 'c') {
            printf("close=%s\n", cq_err(n ? cuIpcCloseMemHandle(opened[--n]) : CUDA_ERROR_INVALID_VALUE));
        } else if (c == 'a') {
            size_t size = 0;
            if (read(in, &size, sizeof size) != sizeof size) return 2;
            CUdeviceptr p = 0;
            printf("ialloc=%s\n", cq_err(cuMemAlloc(&p, size)));
        }
        fflush(stdout);
        if (write(out, &c, 1) != 1) return 2;
    }
    return 0;
}

static int down, up;
static void ask(char c, const void *data, size_t len) {
    char ack = 0;
    if (write(down, &c, 1) != 1 || (len && write(down, data, len) != (ssize_t)len) || read(up, &ack, 1) != 1) {
        fprintf(stderr, "ipc_shared: importer gone\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--importer") == 0) return importer(atoi(argv[2]), atoi(argv[3]));
    int d[2], u[2];
    if (pipe(d) || pipe(u)) return 2;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        const char *usage = getenv("CQ_IMPORTER_USAGE_FILE");
        if (usage) setenv("CUQUOTA_USAGE_FILE", usage, 1);
        char a[16], b[16];
        snprintf(a, sizeof a, "%d", d[0]);
        snprintf(b, sizeof b, "%d", u[1]);
        execl("/proc/self/exe", argv[0], "--importer", a, b, (char *)NULL);
        _exit(127);
    }
    down = d[1];
    up = u[0];
    close(d[0]);
    close(u[1]);
    if (context()) return 2;
    for (int a = 1; a < argc; a++) {
        const char *c = argv[a];
        char x[64] = "", y[64] = "";
        if (sscanf(c, "alloc:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            CUresult r = cuMemAlloc(&ptrs[i], (size_t)cq_size(y));
            if (!r) r = cuMemsetD8(ptrs[i], 0x5a, (size_t)cq_size(y));
            printf("alloc.%d=%s\n", i, cq_err(r));
        } else if (sscanf(c, "export:%63s", x) == 1) {
            int i = slot(x);
            printf("export.%d=%s\n", i, cq_err(cuIpcGetMemHandle(&handles[i], ptrs[i])));
        } else if (sscanf(c, "free:%63s", x) == 1) {
            int i = slot(x);
            printf("free.%d=%s\n", i, cq_err(cuMemFree(ptrs[i])));
        } else if (sscanf(c, "open:%63s", x) == 1) {
            fflush(stdout);
            ask('o', &handles[slot(x)], sizeof(CUipcMemHandle));
        } else if (strcmp(c, "close") == 0) {
            fflush(stdout);
            ask('c', NULL, 0);
        } else if (sscanf(c, "ialloc:%63s", x) == 1) {
            size_t size = (size_t)cq_size(x);
            fflush(stdout);
            ask('a', &size, sizeof size);
        } else if (strcmp(c, "charged") == 0) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo(&f, &t);
            if (r) {
                fprintf(stderr, "ipc_shared: cuMemGetInfo: %s\n", cq_err(r));
                return 2;
            }
            printf("charged=%zu\n", t - f);
        } else if (strcmp(c, "used") == 0) {
            cq_rawmem m;
            if (cq_raw_nvml_mem(0, &m)) {
                fprintf(stderr, "ipc_shared: simulator NVML unreachable\n");
                return 2;
            }
            printf("used=%llu\n", m.used);
        } else {
            fprintf(stderr, "ipc_shared: bad command %s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    char q = 'q';
    if (write(down, &q, 1) != 1) return 2;
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "ipc_shared: importer failed\n");
        return 2;
    }
    printf("done=1\n");
    return 0;
}
