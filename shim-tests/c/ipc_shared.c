/* ipc_shared: memory shared between two processes with CUDA IPC, as a hostile tenant uses it (#11 class 1).
 * cuda.h calls cuMemFree of exported memory before the importers close it undefined; a driver that counts
 * references keeps it alive for the importer. A shim that un-charges at the exporter's cuMemFree lets the
 * container allocate the same memory again while the importer still holds it.
 *
 *   ipc_shared CMD...   forks an importer (re-executed, so it loads its own libraries; with
 *                       CQ_IMPORTER_USAGE_FILE set it runs in that container) and runs CMD on the primary
 *                       context of the exporter's device (CQ_EXPORTER_DEVICE, default 0; the importer's is
 *                       CQ_IMPORTER_DEVICE, default 0); every command prints key=value lines:
 *     alloc:I:SIZE      exporter: cuMemAlloc of SIZE (k/m/g) into slot I, written to         alloc.I=<result>
 *     export:I          exporter: cuIpcGetMemHandle of slot I                                export.I=<result>
 *     free:I            exporter: cuMemFree of slot I                                          free.I=<result>
 *     open:I            importer: cuIpcOpenMemHandle of slot I's handle, reads a byte      open=<result> read=0|1
 *     close             importer: cuIpcCloseMemHandle of its last open                           close=<result>
 *     ialloc:SIZE       importer: cuMemAlloc (kept until exit)                                   ialloc=<result>
 *     vcreate:I:SIZE    exporter: cuMemCreate of SIZE, shareable as a POSIX descriptor, mapped read-write and
 *                       written, into slot I                                                 vcreate.I=<result>
 *     vexport:I         exporter: cuMemExportToShareableHandle of slot I; the descriptor goes to the importer
 *                       (SCM_RIGHTS), which imports, maps and reads it  vexport.I=<result> vimport=<result> vread=0|1
 *     vfree:I           exporter: cuMemRelease + cuMemUnmap of slot I                          vfree.I=<result>
 *     vclose            importer: cuMemRelease + cuMemUnmap of its last import                    vclose=<result>
 *     fcreate:I:SIZE    as vcreate, shareable as a fabric handle (CU_MEM_HANDLE_TYPE_FABRIC)     fcreate.I=<result>
 *     fexport:I         exporter: cuMemExportToShareableHandle of slot I as a fabric handle; its 64 bytes go to
 *                       the importer, which imports, maps and reads it   fexport.I=<result> fimport=<result> fread=0|1
 *                       (let go of with vfree / vclose)
 *     pcreate:I:SIZE    exporter: cuMemAllocFromPoolAsync of SIZE from a pool shareable as a POSIX descriptor
 *                       (made at the first pcreate), written, into slot I                      pcreate.I=<result>
 *     pexport:I         exporter: cuMemPoolExportPointer of slot I (at the first, also the pool, with
 *                       cuMemPoolExportToShareableHandle: the importer imports it, ppool=<result>); the importer
 *                       imports the pointer and reads it                 pexport.I=<result> pimport=<result> pread=0|1
 *     pfree:I           exporter: cuMemFreeAsync of slot I + cuStreamSynchronize                  pfree.I=<result>
 *     pkeep             exporter: its pool's release threshold to UINT64_MAX (freed blocks stay reserved)
 *                                                                                                    pkeep=<result>
 *     pdestroy          exporter: cuMemPoolDestroy of its pool (allocations still out)             pdestroy=<result>
 *     pclose            importer: cuMemFree of its last imported pool pointer                       pclose=<result>
 *     kill              the importer dies by SIGKILL, holding whatever it holds                        killed=1
 *     reset             exporter: cuDevicePrimaryCtxReset of device 0 (its plain allocations go with the
 *                       context; none is current afterwards)                                       reset=<result>
 *     idev:N            importer: device N's primary context made current                            idev=<result>
 *     used[:N]          the simulator's own used bytes on device N (default 0; NVML, past any interposer)  used=
 *     charged           exporter's cuMemGetInfo total − free: what the shim charged its container  charged=
 *   and done=1 at the end.
 */
#include "cq_driver.h"
#include "cq_vmm.h"
#include <signal.h>
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

/* The exporter's device (CQ_EXPORTER_DEVICE): where it allocates, creates and pools. */
static int edev;
static CUmemGenericAllocationHandle vhandles[SLOTS];
static CUdeviceptr pptrs[SLOTS];
static CUmemoryPool pool;
static int pool_shared;
static CUdeviceptr vmaps[SLOTS];
static size_t vsizes[SLOTS];

/* Reserves, maps and opens `size` bytes of handle `h`. */
static CUresult vmap(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr *va) {
    CUmemAccessDesc a = cq_vmm_access(0);
    CUresult r = cuMemAddressReserve(va, size, 0, 0, 0);
    if (!r) r = cuMemMap(*va, size, 0, h, 0);
    if (!r) r = cuMemSetAccess(*va, size, &a, 1);
    return r;
}

/* cuMemCreate of `size` into slot i, shareable as `type`, mapped read-write and written. */
static CUresult vcreate(int i, const char *size, CUmemAllocationHandleType type) {
    CUmemAllocationProp p = cq_vmm_prop(edev, type);
    vsizes[i] = (size_t)cq_size(size);
    CUresult r = cuMemCreate(&vhandles[i], vsizes[i], &p, 0);
    if (!r) r = vmap(vhandles[i], vsizes[i], &vmaps[i]);
    if (!r) r = cuMemsetD8(vmaps[i], 0x5a, vsizes[i]);
    return r;
}

static CUresult vfree(CUmemGenericAllocationHandle h, CUdeviceptr va, size_t size) {
    CUresult r = cuMemRelease(h);
    if (!r) r = cuMemUnmap(va, size);
    if (!r) r = cuMemAddressFree(va, size);
    return r;
}

/* The descriptor and the size go together; exits when the importer is gone. */
static void send_fd(int sock, int fd, size_t size) {
    if (cq_send_fd(sock, fd, &size, sizeof size)) exit(2);
}

/* The device named by environment variable `var` (default 0). */
static int device_from(const char *var) {
    const char *v = getenv(var);
    return v ? atoi(v) : 0;
}

static int context(int ordinal) {
    if (cuInit(0) || cq_use_device(ordinal)) {
        fprintf(stderr, "ipc_shared: no context\n");
        return 2;
    }
    return 0;
}

/* The importer: reads one command letter (+ a handle for 'o') at a time, answers with a byte when done. */
static int importer(int in, int out, int sock) {
    if (context(device_from("CQ_IMPORTER_DEVICE"))) return 2;
    CUdeviceptr opened[SLOTS];
    int n = 0;
    CUmemGenericAllocationHandle vh[SLOTS];
    CUdeviceptr vva[SLOTS];
    size_t vsz[SLOTS];
    int vn = 0;
    CUmemoryPool ipool = NULL;
    CUdeviceptr pimported[SLOTS];
    int pn = 0;
    for (;;) {
        char c = 0;
        if (read(in, &c, 1) != 1 || c == 'q') break;
        if (c == 'k') raise(SIGKILL);
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
        } else if (c == 'v' || c == 'f') {
            /* 'v': a POSIX descriptor (SCM_RIGHTS) with the size; 'f': a fabric handle's bytes, then the size. */
            CUmemFabricHandle fh;
            size_t size = 0;
            int fd = -1;
            CUmemGenericAllocationHandle h = 0;
            CUresult r;
            if (c == 'v') {
                fd = cq_recv_fd(sock, &size, sizeof size);
                r = cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                close(fd);
            } else {
                if (read(in, &fh, sizeof fh) != sizeof fh || read(in, &size, sizeof size) != sizeof size) return 2;
                r = cuMemImportFromShareableHandle(&h, &fh, CU_MEM_HANDLE_TYPE_FABRIC);
            }
            CUdeviceptr va = 0;
            if (!r) r = vmap(h, size, &va);
            unsigned char b = 0;
            int ok = !r && !cuMemcpyDtoH(&b, va, 1) && b == 0x5a;
            if (!r && vn < SLOTS) {
                vh[vn] = h;
                vva[vn] = va;
                vsz[vn++] = size;
            }
            printf("%cimport=%s\n%cread=%d\n", c, cq_err(r), c, ok);
        } else if (c == 'p') {
            size_t unused = 0;
            int fd = cq_recv_fd(sock, &unused, sizeof unused);
            printf("ppool=%s\n", cq_err(cuMemPoolImportFromShareableHandle(&ipool, (void *)(long)fd,
                                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
            close(fd);
        } else if (c == 'i') {
            CUmemPoolPtrExportData data;
            if (read(in, &data, sizeof data) != sizeof data) return 2;
            CUdeviceptr p = 0;
            CUresult r = cuMemPoolImportPointer(&p, ipool, &data);
            unsigned char b = 0;
            int ok = !r && !cuMemcpyDtoH(&b, p, 1) && b == 0x5a;
            if (!r && pn < SLOTS) pimported[pn++] = p;
            printf("pimport=%s\npread=%d\n", cq_err(r), ok);
        } else if (c == 'd') {
            int ordinal = 0;
            if (read(in, &ordinal, sizeof ordinal) != sizeof ordinal) return 2;
            printf("idev=%s\n", cq_err(cq_use_device(ordinal)));
        } else if (c == 'y') {
            printf("pclose=%s\n", cq_err(pn ? cuMemFree(pimported[--pn]) : CUDA_ERROR_INVALID_VALUE));
        } else if (c == 'x') {
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            if (vn) {
                vn--;
                r = vfree(vh[vn], vva[vn], vsz[vn]);
            }
            printf("vclose=%s\n", cq_err(r));
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
    if (argc == 5 && strcmp(argv[1], "--importer") == 0)
        return importer(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    int d[2], u[2], sv[2];
    if (pipe(d) || pipe(u) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 2;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        const char *usage = getenv("CQ_IMPORTER_USAGE_FILE");
        if (usage) setenv("CUQUOTA_USAGE_FILE", usage, 1);
        char a[16], b[16], c[16];
        snprintf(a, sizeof a, "%d", d[0]);
        snprintf(b, sizeof b, "%d", u[1]);
        snprintf(c, sizeof c, "%d", sv[1]);
        execl("/proc/self/exe", argv[0], "--importer", a, b, c, (char *)NULL);
        _exit(127);
    }
    down = d[1];
    up = u[0];
    int sock = sv[0];
    close(d[0]);
    close(u[1]);
    close(sv[1]);
    edev = device_from("CQ_EXPORTER_DEVICE");
    if (context(edev)) return 2;
    for (int a = 1; a < argc; a++) {
        const char *c = argv[a];
        char x[64] = "", y[64] = "";
        if (sscanf(c, "alloc:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            CUresult r = cuMemAlloc(&ptrs[i], (size_t)cq_size(y));
            if (!r) r = cuMemsetD8(ptrs[i], 0x5a, (size_t)cq_size(y));
            printf("alloc.%d=%s\n", i, cq_err(r));
        } else if (sscanf(c, "vcreate:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            printf("vcreate.%d=%s\n", i, cq_err(vcreate(i, y, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
        } else if (sscanf(c, "fcreate:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            printf("fcreate.%d=%s\n", i, cq_err(vcreate(i, y, CU_MEM_HANDLE_TYPE_FABRIC)));
        } else if (sscanf(c, "fexport:%63s", x) == 1) {
            int i = slot(x);
            CUmemFabricHandle fh;
            memset(&fh, 0, sizeof fh);
            CUresult r = cuMemExportToShareableHandle(&fh, vhandles[i], CU_MEM_HANDLE_TYPE_FABRIC, 0);
            printf("fexport.%d=%s\n", i, cq_err(r));
            fflush(stdout);
            if (!r) {
                char msg[sizeof fh + sizeof(size_t)];
                memcpy(msg, &fh, sizeof fh);
                memcpy(msg + sizeof fh, &vsizes[i], sizeof(size_t));
                ask('f', msg, sizeof msg);
            }
        } else if (sscanf(c, "pcreate:%63[^:]:%63s", x, y) == 2) {
            int i = slot(x);
            CUresult r = CUDA_SUCCESS;
            if (!pool) {
                CUmemPoolProps pp;
                memset(&pp, 0, sizeof pp);
                pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
                pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                pp.location.id = edev;
                r = cuMemPoolCreate(&pool, &pp);
            }
            size_t size = (size_t)cq_size(y);
            if (!r) r = cuMemAllocFromPoolAsync(&pptrs[i], size, pool, 0);
            if (!r) r = cuMemsetD8Async(pptrs[i], 0x5a, size, 0);
            if (!r) r = cuStreamSynchronize(0);
            printf("pcreate.%d=%s\n", i, cq_err(r));
        } else if (sscanf(c, "pexport:%63s", x) == 1) {
            int i = slot(x);
            CUresult r = CUDA_SUCCESS;
            if (!pool_shared) {
                int fd = -1;
                r = cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                if (!r) {
                    fflush(stdout);
                    send_fd(sock, fd, 0);
                    close(fd);
                    ask('p', NULL, 0);
                    pool_shared = 1;
                }
            }
            CUmemPoolPtrExportData data;
            memset(&data, 0, sizeof data);
            if (!r) r = cuMemPoolExportPointer(&data, pptrs[i]);
            printf("pexport.%d=%s\n", i, cq_err(r));
            fflush(stdout);
            if (!r) ask('i', &data, sizeof data);
        } else if (sscanf(c, "pfree:%63s", x) == 1) {
            int i = slot(x);
            CUresult r = cuMemFreeAsync(pptrs[i], 0);
            if (!r) r = cuStreamSynchronize(0);
            printf("pfree.%d=%s\n", i, cq_err(r));
        } else if (strcmp(c, "pkeep") == 0) {
            cuuint64_t keep = ~(cuuint64_t)0;
            printf("pkeep=%s\n", cq_err(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep)));
        } else if (strcmp(c, "pdestroy") == 0) {
            printf("pdestroy=%s\n", cq_err(cuMemPoolDestroy(pool)));
            pool = NULL;
        } else if (strcmp(c, "pclose") == 0) {
            fflush(stdout);
            ask('y', NULL, 0);
        } else if (sscanf(c, "vexport:%63s", x) == 1) {
            int i = slot(x), fd = -1;
            CUresult r = cuMemExportToShareableHandle(&fd, vhandles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            printf("vexport.%d=%s\n", i, cq_err(r));
            fflush(stdout);
            if (!r) {
                send_fd(sock, fd, vsizes[i]);
                close(fd);
                ask('v', NULL, 0);
            }
        } else if (sscanf(c, "vfree:%63s", x) == 1) {
            int i = slot(x);
            printf("vfree.%d=%s\n", i, cq_err(vfree(vhandles[i], vmaps[i], vsizes[i])));
        } else if (strcmp(c, "kill") == 0) {
            char k = 'k';
            int status = 0;
            if (write(down, &k, 1) != 1 || waitpid(child, &status, 0) != child || !WIFSIGNALED(status)) {
                fprintf(stderr, "ipc_shared: the importer did not die\n");
                return 2;
            }
            child = 0;
            printf("killed=1\n");
        } else if (strcmp(c, "reset") == 0) {
            CUdevice dev;
            CUresult r = cuDeviceGet(&dev, edev);
            if (!r) r = cuDevicePrimaryCtxReset(dev);
            printf("reset=%s\n", cq_err(r));
        } else if (strcmp(c, "vclose") == 0) {
            fflush(stdout);
            ask('x', NULL, 0);
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
        } else if (sscanf(c, "idev:%63s", x) == 1) {
            int ordinal = atoi(x);
            fflush(stdout);
            ask('d', &ordinal, sizeof ordinal);
        } else if (strcmp(c, "used") == 0 || sscanf(c, "used:%63s", x) == 1) {
            cq_rawmem m;
            if (cq_raw_nvml_mem(strcmp(c, "used") == 0 ? 0 : (unsigned)atoi(x), &m)) {
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
    int status = 0;
    if (child && (write(down, &q, 1) != 1 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
                  WEXITSTATUS(status))) {
        fprintf(stderr, "ipc_shared: importer failed\n");
        return 2;
    }
    printf("done=1\n");
    return 0;
}
