/* Shareable VMM handles on the simulator, between two processes of one state file: cuMemCreate with a POSIX
 * file descriptor handle type, cuMemExportToShareableHandle, the descriptor passed with SCM_RIGHTS,
 * cuMemImportFromShareableHandle and a mapping in the importer (same bytes), and the memory living on after
 * the exporter releases and unmaps it until the importer lets go too (charged to the exporter). Device 0 has
 * 1 GiB and a 64 MiB context. Run by tests/smoke.rs; prints "OK". */
#include "../../../c/cq_vmm.h"
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

#define SIZE (64 * MB)

static size_t used(void) {
    size_t f = 0, t = 0;
    CU(cuMemGetInfo(&f, &t));
    return t - f;
}

static void step(int fd, char c) { CHECK(write(fd, &c, 1) == 1); }
static char wait_for(int fd) {
    char c = 0;
    CHECK(read(fd, &c, 1) == 1);
    return c;
}

static CUdeviceptr map(CUmemGenericAllocationHandle h) {
    CUdeviceptr va = 0;
    CU(cuMemAddressReserve(&va, SIZE, 0, 0, 0));
    CU(cuMemMap(va, SIZE, 0, h, 0));
    CUmemAccessDesc acc = cq_vmm_access(0);
    CU(cuMemSetAccess(va, SIZE, &acc, 1));
    return va;
}

static void unmap(CUdeviceptr va) {
    CU(cuMemUnmap(va, SIZE));
    CU(cuMemAddressFree(va, SIZE));
}

static void setup(void) {
    CU(cuInit(0));
    CU(cq_use_device(0));
}

static int importer(int sock) {
    setup();
    step(sock, 's');
    char c;
    int fd = cq_recv_fd(sock, &c, 1);
    CHECK(fd >= 0);
    CUmemGenericAllocationHandle h = 0;
    size_t before = used();
    CU(cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CHECK(used() == before); /* an import charges nothing */
    CUdeviceptr va = map(h);
    unsigned char b[4] = {0};
    CU(cuMemcpyDtoH(b, va + SIZE - 4, 4));
    CHECK(b[0] == 0x5a);
    step(sock, 'm');
    CHECK(wait_for(sock) == 'r'); /* the exporter released and unmapped */
    CU(cuMemRelease(h));
    CU(cuMemcpyDtoH(b, va, 4)); /* still mapped here: still the same bytes */
    CHECK(b[0] == 0x5a);
    step(sock, '1');
    CHECK(wait_for(sock) == 'u');
    unmap(va);
    step(sock, 'u');
    return failures ? 1 : 0;
}

int main(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t child = fork();
    if (child == 0) {
        close(sv[0]);
        return importer(sv[1]);
    }
    close(sv[1]);
    int sock = sv[0];
    setup();
    CHECK(wait_for(sock) == 's'); /* the importer's context exists: `base` includes it */
    size_t base = used();
    CUmemGenericAllocationHandle plain, h;
    CUmemAllocationProp p0 = cq_vmm_prop(0, 0), p1 = cq_vmm_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CU(cuMemCreate(&plain, SIZE, &p0, 0));
    int fd = -1;
    /* not created shareable: refused, as the real driver */
    CHECK(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
          CUDA_ERROR_INVALID_VALUE);
    CU(cuMemRelease(plain));
    CU(cuMemCreate(&h, SIZE, &p1, 0));
    CUdeviceptr va = map(h);
    CU(cuMemsetD8(va, 0x5a, SIZE));
    CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CHECK(fd >= 0);
    CHECK(cq_send_fd(sock, fd, "f", 1) == 0);
    close(fd);
    CHECK(wait_for(sock) == 'm');
    CHECK(used() == base + SIZE); /* one allocation, wherever it is mapped */
    CU(cuMemRelease(h));
    unmap(va);
    CHECK(used() == base + SIZE); /* the importer holds it */
    step(sock, 'r');
    CHECK(wait_for(sock) == '1');
    CHECK(used() == base + SIZE); /* released there too, but still mapped */
    step(sock, 'u');
    CHECK(wait_for(sock) == 'u');
    CHECK(used() <= base); /* gone with the last mapping (the importer may be exiting too) */
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failures) return 1;
    printf("OK\n");
    return 0;
}
