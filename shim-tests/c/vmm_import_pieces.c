/* vmm_import_pieces: a VMM allocation imported from another container, mapped in pieces (before the fix it was
 * charged at its first cuMemMap by the *mapping's* size, and a later mapping of the same handle only when it was
 * larger than what was charged): an importer
 * maps a 1 GiB import as N pieces of 1/N at N offsets, and must be charged all of it.
 *
 *   vmm_import_pieces N    exporter (this process, container of CUQUOTA_USAGE_FILE) creates 1 GiB shareable as a
 *                           POSIX descriptor, exports it to the importer (re-executed, CQ_IMPORTER_USAGE_FILE's
 *                           container), which imports it and maps it as N pieces; the exporter releases its
 *                           handle; the importer then asks cuMemAlloc for 768 MiB and prints
 *                           import= map= ialloc= charged= (its cuMemGetInfo total-free) used= (the simulator's)
 */
#include "cq_driver.h"
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define GIB (1ull << 30)

static void send_fd(int sock, int fd) {
    char one = 1;
    struct iovec iov = {&one, 1};
    char ctl[CMSG_SPACE(sizeof(int))];
    memset(ctl, 0, sizeof ctl);
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != 1) exit(2);
}

static int recv_fd(int sock) {
    char one;
    struct iovec iov = {&one, 1};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) != 1) return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}

static int context(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "vmm_import_pieces: no context\n");
        return 2;
    }
    return 0;
}

static int importer(int sock, int n) {
    if (context()) return 2;
    int fd = recv_fd(sock);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    printf("import=%s\n", cq_err(r));
    CUdeviceptr va = 0;
    CUresult m = cuMemAddressReserve(&va, GIB, 0, 0, 0);
    size_t piece = GIB / n;
    for (int i = 0; i < n && !m; i++) m = cuMemMap(va + i * piece, piece, i * piece, h, 0);
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (!m) m = cuMemSetAccess(va, GIB, &a, 1);
    printf("map=%s\n", cq_err(m));
    fflush(stdout);
    /* Tell the exporter to let go, wait until it did. */
    char c = 'r';
    if (write(sock, &c, 1) != 1 || read(sock, &c, 1) != 1) return 2;
    CUdeviceptr p = 0;
    printf("ialloc=%s\n", cq_err(cuMemAlloc(&p, 768ull << 20)));
    size_t free = 0, total = 0;
    cuMemGetInfo(&free, &total);
    printf("charged=%llu\n", (unsigned long long)(total - free));
    cq_rawmem raw;
    if (cq_raw_nvml_mem(0, &raw) == 0) printf("used=%llu\n", raw.used);
    printf("done=1\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--importer") == 0) return importer(atoi(argv[2]), atoi(argv[3]));
    if (argc != 2) return 2;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 2;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        const char *usage = getenv("CQ_IMPORTER_USAGE_FILE");
        if (usage) setenv("CUQUOTA_USAGE_FILE", usage, 1);
        char s[16];
        snprintf(s, sizeof s, "%d", sv[1]);
        execl("/proc/self/exe", argv[0], "--importer", s, argv[1], (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    if (context()) return 2;
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemCreate(&h, GIB, &p, 0);
    int fd = -1;
    if (!r) r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    printf("create=%s\n", cq_err(r));
    fflush(stdout);
    if (r) return 1;
    send_fd(sv[0], fd);
    close(fd);
    char c;
    if (read(sv[0], &c, 1) != 1) return 2;
    printf("release=%s\n", cq_err(cuMemRelease(h)));
    fflush(stdout);
    if (write(sv[0], &c, 1) != 1) return 2;
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}
