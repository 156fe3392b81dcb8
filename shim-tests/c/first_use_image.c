/* first_use_image: memory the driver takes at first use from module and library images, with and without NVML
 * (issue 35: one first use of any size; none charged without NVML). Each mode takes memory, printing the
 * simulator's own used bytes (used=), then fills (fill CHUNK until refused).
 *
 *   first_use_image cubin_mod SIZE N   N modules (cuModuleLoadData) of a cubin with a zeroed `__device__`
 *                                          global `g` of SIZE bytes, each looked up (cuModuleGetGlobal):
 *                                          global.I=, used=.
 *   first_use_image cubin_lib SIZE N   the same as N libraries (cuLibraryLoadData, cuLibraryGetGlobal).
 *   first_use_image cubin_liar SIZE N  the same modules, the global's symbol SIZE bytes in a 4-byte section.
 *   first_use_image ptx_mod SIZE N     N PTX modules with a `.global .b8 g[SIZE]`.
 *   first_use_image fatbin_lz4 SIZE N  N modules of a fat binary whose one entry (sm_90) is that cubin as an LZ4
 *                                          block (flags 0x2000), each's global looked up.
 *   first_use_image fatbin_zstd SIZE N the same as a Zstandard frame (flags 0x8000, nvcc 13's default mode).
 *   first_use_image graph_lib SIZE N   N libraries of the cubin, each's kernel `k` (cuLibraryGetKernel) the one
 *                                          kernel node of a graph, instantiated and launched (global.I= the
 *                                          launch's result): the library loads into the context at that launch.
 *   first_use_image text_lib SIZE N    N libraries of a CUDASIM-MODULE text image (no format the shim reads)
 *                                          with a SIZE global, each's kernel looked up (cuLibraryGetKernel,
 *                                          cuKernelGetFunction: the library loads into the context).
 * A load refused (over the cap) prints load.I= and ends the loop.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_image"
#include "cq_fill.h"

static unsigned char g_elf[4096];

/* A cubin: kernel `k` (STO_CUDA_ENTRY) in .text.k, object `g` of `sym` bytes in a NOBITS .nv.global of `sec`. */
static size_t cubin(unsigned long long sec, unsigned long long sym) {
    static const char shstr[] = "\0.shstrtab\0.strtab\0.symtab\0.nv.global\0.text.k";
    static const char strtab[] = "\0k\0g";
    unsigned char *e = g_elf;
    memset(e, 0, sizeof g_elf);
    size_t at = 64;
    size_t o_shstr = at;
    memcpy(e + at, shstr, sizeof shstr);
    at += sizeof shstr;
    size_t o_str = at;
    memcpy(e + at, strtab, sizeof strtab);
    at += sizeof strtab;
    at = (at + 7) & ~(size_t)7;
    size_t o_sym = at;
    Elf64_Sym *s = (Elf64_Sym *)(e + at);
    memset(s, 0, 3 * sizeof *s);
    s[1].st_name = 1, s[1].st_info = 0x12, s[1].st_other = 0x10, s[1].st_shndx = 5, s[1].st_size = 16;
    s[2].st_name = 3, s[2].st_info = 0x11, s[2].st_shndx = 4, s[2].st_size = sym;
    at += 3 * sizeof *s;
    size_t o_text = at;
    at += 16;
    at = (at + 7) & ~(size_t)7;
    Elf64_Ehdr *h = (Elf64_Ehdr *)e;
    memcpy(h->e_ident, ELFMAG, SELFMAG);
    h->e_ident[EI_CLASS] = ELFCLASS64;
    h->e_ident[EI_DATA] = ELFDATA2LSB;
    h->e_shoff = at;
    h->e_shentsize = 64;
    h->e_shnum = 6;
    h->e_shstrndx = 1;
    Elf64_Shdr *sh = (Elf64_Shdr *)(e + at);
    memset(sh, 0, 6 * sizeof *sh);
    sh[1] = (Elf64_Shdr){.sh_name = 1, .sh_type = SHT_STRTAB, .sh_offset = o_shstr, .sh_size = sizeof shstr};
    sh[2] = (Elf64_Shdr){.sh_name = 11, .sh_type = SHT_STRTAB, .sh_offset = o_str, .sh_size = sizeof strtab};
    sh[3] = (Elf64_Shdr){.sh_name = 19, .sh_type = SHT_SYMTAB, .sh_offset = o_sym, .sh_size = 3 * sizeof *s,
                         .sh_link = 2, .sh_entsize = sizeof *s};
    sh[4] = (Elf64_Shdr){.sh_name = 27, .sh_type = SHT_NOBITS, .sh_flags = SHF_ALLOC | SHF_WRITE, .sh_size = sec};
    sh[5] = (Elf64_Shdr){.sh_name = 38, .sh_type = SHT_PROGBITS, .sh_flags = SHF_ALLOC | SHF_EXECINSTR,
                         .sh_offset = o_text, .sh_size = 16};
    return at + 6 * sizeof *sh;
}

/* A fat binary of one sm_90 ELF entry: the cubin's `len` bytes, stored as an LZ4 block of literals (`zstd` 0)
 * or a Zstandard frame of one raw block: valid streams of each format, whatever the compressor. */
static unsigned char g_fat[8192];
static const void *fatbin(size_t len, int zstd) {
    unsigned char *f = g_fat, *p = g_fat + 16 + 64;
    memset(g_fat, 0, sizeof g_fat);
    size_t n = 0;
    if (zstd) {
        memcpy(p, "\x28\xb5\x2f\xfd\x60", 5); /* magic; single segment, 2-byte content size (minus 256) */
        p[5] = (unsigned char)((len - 256) & 0xff), p[6] = (unsigned char)((len - 256) >> 8);
        unsigned h = (unsigned)(len << 3) | 1; /* last block, raw, its size */
        p[7] = h & 0xff, p[8] = (h >> 8) & 0xff, p[9] = (h >> 16) & 0xff;
        n = 10;
    } else {
        p[0] = 0xf0; /* 15+ literals, no match */
        size_t extra = len - 15;
        n = 1;
        for (; extra >= 255; extra -= 255) p[n++] = 255;
        p[n++] = (unsigned char)extra;
    }
    memcpy(p + n, g_elf, len);
    n += len;
    size_t padded = (n + 7) & ~(size_t)7;
    unsigned char *e = g_fat + 16;
    uint32_t u32;
    uint64_t u64;
    uint16_t kind = 2, ver = 0x101;
    memcpy(e, &kind, 2), memcpy(e + 2, &ver, 2);
    u32 = 64, memcpy(e + 4, &u32, 4);
    u32 = (uint32_t)padded, memcpy(e + 8, &u32, 4);
    u32 = (uint32_t)n, memcpy(e + 16, &u32, 4);
    u32 = 90, memcpy(e + 28, &u32, 4);
    u64 = zstd ? 0x8011 : 0x2011, memcpy(e + 40, &u64, 8);
    u64 = len, memcpy(e + 56, &u64, 8);
    uint32_t magic = 0xBA55ED50;
    uint16_t fver = 1, hsize = 16;
    memcpy(f, &magic, 4), memcpy(f + 4, &fver, 2), memcpy(f + 6, &hsize, 2);
    u64 = 64 + padded, memcpy(f + 8, &u64, 8);
    return g_fat;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: first_use_image MODE SIZE N [CHUNK]\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long size = cq_size(argv[2]);
    int n = atoi(argv[3]);
    unsigned long long chunk = argc > 4 ? cq_size(argv[4]) : (64ull << 20);
    CUdevice d0;
    primary0(&d0);
    used(0, "used");
    static char text[512];
    for (int i = 0; i < n; i++) {
        CUresult r;
        CUdeviceptr p;
        size_t bytes;
        if (strcmp(mode, "cubin_mod") == 0 || strcmp(mode, "cubin_liar") == 0 || strcmp(mode, "ptx_mod") == 0) {
            const void *image = g_elf;
            if (mode[0] == 'p') {
                snprintf(text, sizeof text,
                         ".version 8.0\n.target sm_90\n.address_size 64\n.visible .global .align 1 .b8 g[%llu];\n"
                         ".visible .entry k() { ret; }\n",
                         size);
                image = text;
            } else if (strcmp(mode, "cubin_liar") == 0) {
                cubin(4, size);
            } else {
                cubin(size, size);
            }
            CUmodule m;
            if ((r = cuModuleLoadData(&m, image)) != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuModuleGetGlobal(&p, &bytes, m, "g");
        } else if (strncmp(mode, "fatbin_", 7) == 0) {
            const void *image = fatbin(cubin(size, size), strcmp(mode, "fatbin_zstd") == 0);
            CUmodule m;
            if ((r = cuModuleLoadData(&m, image)) != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuModuleGetGlobal(&p, &bytes, m, "g");
        } else if (strcmp(mode, "graph_lib") == 0) {
            cubin(size, size);
            CUlibrary l;
            if ((r = cuLibraryLoadData(&l, g_elf, NULL, NULL, 0, NULL, NULL, 0)) != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            CUkernel k;
            CK(cuLibraryGetKernel(&k, l, "k"));
            CUDA_KERNEL_NODE_PARAMS np;
            memset(&np, 0, sizeof np);
            np.kern = k; /* func NULL: the library's kernel, loaded into the context the graph runs in */
            np.gridDimX = np.gridDimY = np.gridDimZ = 1;
            np.blockDimX = np.blockDimY = np.blockDimZ = 1;
            CUgraph g;
            CUgraphNode node;
            CUgraphExec e;
            CK(cuGraphCreate(&g, 0));
            CK(cuGraphAddKernelNode(&node, g, NULL, 0, &np));
            CK(cuGraphInstantiateWithFlags(&e, g, 0));
            r = cuGraphLaunch(e, NULL);
            if (r == CUDA_SUCCESS) CK(cuStreamSynchronize(NULL));
        } else if (strcmp(mode, "cubin_lib") == 0) {
            cubin(size, size);
            CUlibrary l;
            if ((r = cuLibraryLoadData(&l, g_elf, NULL, NULL, 0, NULL, NULL, 0)) != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuLibraryGetGlobal(&p, &bytes, l, "g");
        } else if (strcmp(mode, "text_lib") == 0) {
            snprintf(text, sizeof text, "CUDASIM-MODULE 1\nkernel k 1000\nglobal g %llu\n", size);
            CUlibrary l;
            if ((r = cuLibraryLoadData(&l, text, NULL, NULL, 0, NULL, NULL, 0)) != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            CUkernel k;
            CK(cuLibraryGetKernel(&k, l, "k"));
            CUfunction f;
            r = cuKernelGetFunction(&f, k);
        } else {
            fprintf(stderr, "first_use_image: unknown mode %s\n", mode);
            return 2;
        }
        printf("global.%d=%s\n", i, cq_err(r));
        used(0, "used");
    }
    fill(chunk);
    return 0;
}
