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
#include "cq_vmm.h"
#include <sys/wait.h>
#include <unistd.h>

#define GIB (1ull << 30)

static int context(void) {
    if (cuInit(0) || cq_use_device(0)) {
        fprintf(stderr, "vmm_import_pieces: no context\n");
        return 2;
    }
    return 0;
}

static int importer(int sock, int n) {
    if (context()) return 2;
    char one;
    int fd = cq_recv_fd(sock, &one, 1);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    printf("import=%s\n", cq_err(r));
    CUdeviceptr va = 0;
    CUresult m = cuMemAddressReserve(&va, GIB, 0, 0, 0);
    size_t piece = GIB / n;
    for (int i = 0; i < n && !m; i++) m = cuMemMap(va + i * piece, piece, i * piece, h, 0);
    CUmemAccessDesc a = cq_vmm_access(0);
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
    CUmemAllocationProp p = cq_vmm_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemCreate(&h, GIB, &p, 0);
    int fd = -1;
    if (!r) r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    printf("create=%s\n", cq_err(r));
    fflush(stdout);
    if (r) return 1;
    if (cq_send_fd(sv[0], fd, "f", 1)) return 2;
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
