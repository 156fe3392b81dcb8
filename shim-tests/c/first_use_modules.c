/* first_use_modules: lookups in a module no load hook saw (found by a hostile review: never refused).
 *   first_use_modules MODE N   (MODE: lib = module from cuLibraryGetModule; mod = cuModuleLoadData, CONTROL)
 * A PTX image with N 700 MiB __device__ globals (allocated by the simulator at their first lookup); each looked
 * up with cuModuleGetGlobal: lookup.i=rc, used.0= after each. Then fill. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cq_driver.h"
#include "cq_elf.h"
#define PROG "first_use_modules"
#include "cq_fill.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "lib";
    int n = argc > 2 ? atoi(argv[2]) : 4;
    setvbuf(stdout, NULL, _IONBF, 0);
    CUdevice d0;
    primary0(&d0);
    char img[4096];
    int off = snprintf(img, sizeof img, ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n");
    for (int i = 0; i < n; i++)
        off += snprintf(img + off, sizeof img - off, ".visible .global .align 4 .b8 g%d[734003200];\n", i);
    CUmodule m;
    if (strcmp(mode, "lib") == 0) {
        CUlibrary l;
        CK(cuLibraryLoadData(&l, img, NULL, NULL, 0, NULL, NULL, 0));
        CUresult r = cuLibraryGetModule(&m, l);
        printf("module=%s\n", cq_err(r));
        if (r) {
            used(0, "used.0");
            return 0;
        }
    } else {
        CK(cuModuleLoadData(&m, img));
    }
    used(0, "used.0");
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", i);
        CUdeviceptr p;
        size_t sz;
        CUresult r = cuModuleGetGlobal(&p, &sz, m, name);
        printf("lookup.%d=%s\n", i, cq_err(r));
        used(0, "used.0");
    }
    return 0;
}
