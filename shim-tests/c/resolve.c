/* resolve: a tenant that looks for the REAL cuMemAlloc_v2 through every resolution route the dynamic loader
 * offers, then allocates with it past its cap (issue #11, class 3). One route per run:
 *
 *   resolve ROUTE SIZE COUNT [LIB]
 *
 * ROUTE (how cuMemAlloc_v2 is found; the plumbing — cuInit, the primary context — goes through plain dlsym):
 *   dlsym                 plain dlsym(dlopen("libcuda.so.1"), "cuMemAlloc_v2")
 *   dlvsym-lib:VER        dlvsym(dlopen("libcuda.so.1"), "cuMemAlloc_v2", VER)   (VER: "bogus", "GLIBC_2.34", ...;
 *                         not "": glibc's own dlvsym dereferences NULL on an empty version)
 *   dlvsym-default:VER    dlvsym(RTLD_DEFAULT, ...)     dlvsym-next:VER   dlvsym(RTLD_NEXT, ...)
 *   dlvsym-versioned      dlvsym(dlopen(LIB), "cuMemAlloc_v2", "CUQUOTA_TEST_1"), LIB = resolve_versioned.c (which
 *                         defines it under that version); prints ours=1 when that is libcuquota's export
 *   dlsym-dlsym           dlsym found with dlsym(libc, "dlsym"), then dlsym(libcuda, "cuMemAlloc_v2")
 *   dlvsym-dlsym:VER      dlsym found with dlvsym(libc, "dlsym", VER), then dlsym(libcuda, "cuMemAlloc_v2")
 *   dlsym-dlvsym          dlvsym found with dlsym(libc, "dlvsym"), then as dlvsym-dlsym:GLIBC_2.34
 *   dlvsym-gpa            dlsym found as in dlvsym-dlsym:GLIBC_2.34, then cuGetProcAddress_v2 with it, then
 *                         cuMemAlloc at cudaVersion 12000 through that
 *   gpa:VER:FLAGS         cuGetProcAddress_v2 (found with dlsym) of "cuMemAlloc" at cudaVersion VER, flags FLAGS
 *   gpa1:VER:FLAGS        the same through the CUDA 11 cuGetProcAddress (no symbolStatus)
 *   gpa-gpa               cuGetProcAddress_v2 found through cuGetProcAddress_v2 ("cuGetProcAddress", 13000), then
 *                         cuMemAlloc at 12000 through that
 *   dlmopen-cuda          dlmopen(LM_ID_NEWLM, "libcuda.so.1"), then that namespace's own dlsym (found with
 *                         dlsym(handle, "dlsym")) for cuInit, a context and cuMemAlloc_v2
 *   dlmopen-lib           dlmopen(LM_ID_NEWLM, LIB): LIB (resolve_lib.c) imports cuMemAlloc_v2 from libcuda
 *   deepbind-lib          dlopen(LIB, RTLD_NOW | RTLD_DEEPBIND): LIB's own scope (its libcuda) first
 *   export-table          the primary context from cuGetExportTable's CUDART_INTERFACE table (slot 2, as the CUDA
 *                         runtime gets it), then cuMemAlloc_v2 through plain dlsym (ours) in it
 *   export-table-async    the same, then cuMemAllocAsync on the legacy stream (the device's default pool)
 *   elf                   libcuda's own dynamic symbol table, read through dlinfo's link map (cq_elf.h)
 *
 * Then COUNT allocations of SIZE bytes with what was found (in a namespace of its own, LIB does it all itself).
 * Prints route=, found=0|1 (and open.error= when the loader refused), alloc.ok=N, alloc.fail=N, then
 * sim.used= (the simulator's own device-0 figure, past any interposer: the ground truth).
 */
#include "cq_driver.h"
#include <gnu/lib-names.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef void *(*dlsym_fn)(void *, const char *);
typedef int (*lib_alloc_fn)(size_t, int);

static CUresult (*g_alloc_async)(CUdeviceptr *, size_t, CUstream);
static CUresult alloc_async(CUdeviceptr *p, size_t n) {
    return g_alloc_async(p, n, NULL);
}

static void *must(void *p, const char *what) {
    if (!p) {
        const char *e = dlerror();
        fprintf(stderr, "resolve: %s: %s\n", what, e ? e : "not found");
        exit(2);
    }
    return p;
}

/* The context every route allocates in: through plain (hooked) dlsym. */
static void plumbing(void *cuda) {
    CUresult (*init)(unsigned) = must(dlsym(cuda, "cuInit"), "cuInit");
    CUresult (*get)(CUdevice *, int) = must(dlsym(cuda, "cuDeviceGet"), "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = must(dlsym(cuda, "cuDevicePrimaryCtxRetain"), "retain");
    CUresult (*set)(CUcontext) = must(dlsym(cuda, "cuCtxSetCurrent"), "cuCtxSetCurrent");
    CUdevice d;
    CUcontext c;
    if (init(0) || get(&d, 0) || retain(&c, d) || set(c)) {
        fprintf(stderr, "resolve: no context\n");
        exit(2);
    }
}

static void report_used(void) {
    cq_rawmem m;
    if (cq_raw_nvml_mem(0, &m) == 0)
        printf("sim.used=%llu\n", m.used);
    else
        printf("sim.error=unreachable\n");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: resolve ROUTE SIZE COUNT [LIB]\n");
        return 2;
    }
    const char *route = argv[1];
    size_t size = strtoull(argv[2], NULL, 0);
    int count = atoi(argv[3]);
    const char *lib = argc > 4 ? argv[4] : NULL;
    printf("route=%s\n", route);
    void *cuda = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "dlopen libcuda.so.1");
    void *libc = must(dlopen(LIBC_SO, RTLD_NOW | RTLD_NOLOAD), "dlopen libc");
    const char *ver = strchr(route, ':') ? strchr(route, ':') + 1 : "bogus";
    alloc_fn alloc = NULL;
    lib_alloc_fn lib_alloc = NULL;
    int plumbed = 0; /* the context is made already */

    if (strcmp(route, "dlsym") == 0) {
        alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    } else if (strncmp(route, "dlvsym-lib:", 11) == 0) {
        alloc = (alloc_fn)dlvsym(cuda, "cuMemAlloc_v2", ver);
    } else if (strncmp(route, "dlvsym-default:", 15) == 0) {
        alloc = (alloc_fn)dlvsym(RTLD_DEFAULT, "cuMemAlloc_v2", ver);
    } else if (strncmp(route, "dlvsym-next:", 12) == 0) {
        alloc = (alloc_fn)dlvsym(RTLD_NEXT, "cuMemAlloc_v2", ver);
    } else if (strcmp(route, "dlvsym-versioned") == 0) {
        void *h = must(dlopen(lib, RTLD_NOW | RTLD_LOCAL), "dlopen LIB");
        void *p = dlvsym(h, "cuMemAlloc_v2", "CUQUOTA_TEST_1");
        void *ours = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"); /* the preload's export: first in the global scope */
        printf("found=%d\nours=%d\n", p != NULL, p != NULL && p == ours);
        return 0;
    } else if (strcmp(route, "dlsym-dlsym") == 0) {
        dlsym_fn s = (dlsym_fn)must(dlsym(libc, "dlsym"), "dlsym(libc, dlsym)");
        alloc = (alloc_fn)s(cuda, "cuMemAlloc_v2");
    } else if (strncmp(route, "dlvsym-dlsym:", 13) == 0) {
        dlsym_fn s = (dlsym_fn)must(dlvsym(libc, "dlsym", ver), "dlvsym(libc, dlsym)");
        alloc = (alloc_fn)s(cuda, "cuMemAlloc_v2");
    } else if (strcmp(route, "dlsym-dlvsym") == 0) {
        dlvsym_fn v = (dlvsym_fn)must(dlsym(libc, "dlvsym"), "dlsym(libc, dlvsym)");
        dlsym_fn s = (dlsym_fn)must(v(libc, "dlsym", "GLIBC_2.34"), "dlvsym(libc, dlsym)");
        alloc = (alloc_fn)s(cuda, "cuMemAlloc_v2");
    } else if (strcmp(route, "dlvsym-gpa") == 0) {
        dlsym_fn s = (dlsym_fn)must(dlvsym(libc, "dlsym", "GLIBC_2.34"), "dlvsym(libc, dlsym)");
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
            s(cuda, "cuGetProcAddress_v2");
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        if (gpa && gpa("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS) alloc = p;
    } else if (strncmp(route, "gpa:", 4) == 0 || strncmp(route, "gpa1:", 5) == 0) {
        int v = 0;
        unsigned long long flags = 0;
        if (sscanf(ver, "%d:%llu", &v, &flags) != 2) {
            fprintf(stderr, "resolve: bad route %s\n", route);
            return 2;
        }
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        if (route[3] == '1') {
            CUresult (*gpa1)(const char *, void **, int, cuuint64_t) = must(dlsym(cuda, "cuGetProcAddress"), "gpa");
            if (gpa1("cuMemAlloc", &p, v, flags) == CUDA_SUCCESS) alloc = p;
        } else {
            CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
                must(dlsym(cuda, "cuGetProcAddress_v2"), "gpa");
            if (gpa("cuMemAlloc", &p, v, flags, &st) == CUDA_SUCCESS) alloc = p;
        }
    } else if (strcmp(route, "gpa-gpa") == 0) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
            must(dlsym(cuda, "cuGetProcAddress_v2"), "gpa");
        void *g = NULL, *p = NULL;
        CUdriverProcAddressQueryResult st;
        if (gpa("cuGetProcAddress", (void **)&g, 13000, 0, &st) == CUDA_SUCCESS && g) {
            gpa = g;
            if (gpa("cuMemAlloc", &p, 12000, 0, &st) == CUDA_SUCCESS) alloc = p;
        }
    } else if (strcmp(route, "dlmopen-cuda") == 0) {
        void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        if (!h) printf("open.error=%s\n", dlerror());
        /* A namespace of its own: its own driver (which needs its own cuInit and context), and its own libc,
         * whose dlsym no preload shadows. */
        dlsym_fn s = h ? (dlsym_fn)dlsym(h, "dlsym") : NULL;
        CUresult (*init)(unsigned) = s ? s(h, "cuInit") : NULL;
        CUresult (*get)(CUdevice *, int) = s ? s(h, "cuDeviceGet") : NULL;
        CUresult (*retain)(CUcontext *, CUdevice) = s ? s(h, "cuDevicePrimaryCtxRetain") : NULL;
        CUresult (*set)(CUcontext) = s ? s(h, "cuCtxSetCurrent") : NULL;
        CUdevice d;
        CUcontext c;
        if (init && get && retain && set && !init(0) && !get(&d, 0) && !retain(&c, d) && !set(c))
            alloc = (alloc_fn)s(h, "cuMemAlloc_v2");
        plumbed = 1;
    } else if (strcmp(route, "dlmopen-lib") == 0 || strcmp(route, "deepbind-lib") == 0) {
        void *h = route[0] == 'd' && route[2] == 'm' ? dlmopen(LM_ID_NEWLM, lib, RTLD_NOW)
                                                     : dlopen(lib, RTLD_NOW | RTLD_DEEPBIND);
        if (!h) printf("open.error=%s\n", dlerror());
        lib_alloc = h ? (lib_alloc_fn)dlsym(h, "resolve_lib_alloc") : NULL;
    } else if (strcmp(route, "export-table") == 0 || strcmp(route, "export-table-async") == 0) {
        CUresult (*get)(const void **, const CUuuid *) = must(dlsym(cuda, "cuGetExportTable"), "cuGetExportTable");
        CUresult (*init)(unsigned) = must(dlsym(cuda, "cuInit"), "cuInit");
        CUresult (*set)(CUcontext) = must(dlsym(cuda, "cuCtxSetCurrent"), "cuCtxSetCurrent");
        const CUuuid cudart_interface = {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39,
                                          0x12, 0xfd, 0x9d, 0xf9}};
        const void *table = NULL;
        CUcontext c = NULL;
        if (init(0) == CUDA_SUCCESS && get(&table, &cudart_interface) == CUDA_SUCCESS && table) {
            CUresult (*primary)(CUcontext *, CUdevice) = ((void *const *)table)[2];
            if (primary(&c, 0) == CUDA_SUCCESS && set(c) == CUDA_SUCCESS) {
                if (route[12] == '-') {
                    g_alloc_async = dlsym(cuda, "cuMemAllocAsync");
                    alloc = g_alloc_async ? alloc_async : NULL;
                } else {
                    alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
                }
                plumbed = 1;
            }
        }
    } else if (strcmp(route, "elf") == 0) {
        alloc = (alloc_fn)cq_elf_sym(cuda, "cuMemAlloc_v2");
    } else {
        fprintf(stderr, "resolve: unknown route %s\n", route);
        return 2;
    }

    int ok = 0;
    if (lib_alloc) {
        printf("found=1\n");
        ok = lib_alloc(size, count);
    } else if (alloc) {
        printf("found=1\n");
        if (!plumbed) plumbing(cuda);
        for (int i = 0; i < count; i++) {
            CUdeviceptr p;
            if (alloc(&p, size) == CUDA_SUCCESS) ok++;
        }
    } else {
        printf("found=0\n");
    }
    printf("alloc.ok=%d\nalloc.fail=%d\n", ok, count - ok);
    report_used();
    fflush(stdout);
    return 0;
}
