/* cq_vmm.h: what the VMM test programs share (the shim's, the simulator's vmm_share.c and elastic.c, cq_elastic.h and
 * bench/elastic_common.h): a device's primary context, the properties and access of pinned memory, a byte pattern
 * that shows memory kept its contents across remapping, and a descriptor passed over a Unix socket (SCM_RIGHTS)
 * to the importing process. Needs only cuda.h. */
#ifndef CQ_VMM_H
#define CQ_VMM_H
#include <cuda.h>
#include <string.h>
#include <sys/socket.h>

/* Device `ordinal`'s primary context made current (cuInit first). */
static inline CUresult cq_use_device(int ordinal) {
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuDeviceGet(&dev, ordinal);
    if (!r) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r) r = cuCtxSetCurrent(ctx);
    return r;
}

/* Pinned memory at `type`/`id` (a device, the host, a NUMA node), not shareable. */
static inline CUmemAllocationProp cq_vmm_prop_at(CUmemLocationType type, int id) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = type;
    p.location.id = id;
    return p;
}

/* Pinned memory on device `dev`, shareable as `types` (0: not shareable). */
static inline CUmemAllocationProp cq_vmm_prop(int dev, CUmemAllocationHandleType types) {
    CUmemAllocationProp p = cq_vmm_prop_at(CU_MEM_LOCATION_TYPE_DEVICE, dev);
    p.requestedHandleTypes = types;
    return p;
}

/* Read-write access from device `dev`. */
static inline CUmemAccessDesc cq_vmm_access(int dev) {
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
}

/* Access `flags` from device `dev` to [p, p + n). */
static inline CUresult cq_vmm_set_access(CUdeviceptr p, size_t n, int dev, CUmemAccess_flags flags) {
    CUmemAccessDesc a = cq_vmm_access(dev);
    a.flags = flags;
    return cuMemSetAccess(p, n, &a, 1);
}

/* Fills [p, p + n) with the pattern of `seed` (no period of a page or less). */
static inline void cq_pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed + (i >> 12));
}

/* Index of the first byte that is not the pattern of `seed` plus `plus`, or n. */
static inline size_t cq_pattern_diff(const unsigned char *p, size_t n, unsigned seed, unsigned plus) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31 + seed + (i >> 12) + plus)) return i;
    return n;
}

/* Sends descriptor `fd` with the `len` bytes at `data` (at least one: a message carries data) on `sock`;
 * 0, or -1 when it could not. */
static inline int cq_send_fd(int sock, int fd, const void *data, size_t len) {
    struct iovec iov = {(void *)data, len};
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
    return sendmsg(sock, &m, 0) == (ssize_t)len ? 0 : -1;
}

/* Receives what cq_send_fd sent: the `len` bytes into `data`; the descriptor, or -1. */
static inline int cq_recv_fd(int sock, void *data, size_t len) {
    struct iovec iov = {data, len};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) != (ssize_t)len) return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    int fd = -1;
    if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}
#endif
