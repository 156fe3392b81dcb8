/* first_use_lies: images that lie to the footprint reader (src/memory/image.rs) while the driver loads them as
 * it reads them (hostile review of issue 35 item 2). Each mode loads N modules, looks each one's global `g` up
 * (cuModuleGetGlobal: the driver takes its SIZE bytes then), printing global.I= and the simulator's used=, then
 * fills (cq_fill.h).
 *
 *   first_use_lies honest SIZE N    a plain cubin (control): `g` in a NOBITS `.nv.global` of SIZE bytes.
 *   first_use_lies noname SIZE N    the same cubin, its `.shstrtab` 1 byte long (the names lie past it, where
 *                                       the driver still reads them) and `.nv.global` without SHF_ALLOC.
 *   first_use_lies overflow SIZE N  the plain cubin plus an object symbol of 2^64-1 bytes in `.text.k` (no
 *                                       global of the driver's: it takes only `g`).
 *   first_use_lies ptxhex SIZE N    PTX with `g[SIZE]` and a `.global .b8 pad[0x10]` (a hex dimension).
 *   first_use_lies reload SIZE N    the plain cubin loaded, looked up and unloaded N times (a leak refuses).
 *   first_use_lies fifo SIZE N      cuModuleLoad of a FIFO: a writer thread hands the plain cubin to the
 *                                       driver's read, then a 1-byte-global one to whoever opens it next.
 *   first_use_lies pipe SIZE N      cuModuleLoad of a FIFO written once (a module read from a pipe).
 *   first_use_lies ctxcycle SIZE N  one library of the plain cubin; N times: a context created, its global
 *                                       looked up there (cuLibraryGetGlobal), the context destroyed.
 *   first_use_lies fatjunk SIZE N   a fat binary of the plain cubin (sm_90) and an sm_80 entry that is no ELF.
 *   first_use_lies fatptxjunk SIZE N  the same with a compute_80 PTX entry that is no PTX (one the device could
 *                                       JIT-compile, though the driver takes the cubin).
 *   first_use_lies fatmulti SIZE N  a fat binary of an sm_80 cubin (a 1-byte global) and the plain cubin (sm_90).
 *   first_use_lies libfile SIZE N   the plain cubin as a file, N libraries of it (cuLibraryLoadFromFile,
 *                                       cuLibraryGetGlobal).
 *   first_use_lies flip SIZE N      the plain cubin (its `.nv.global` section 4 bytes: the symbol alone says how
 *                                       big `g` is) loaded N times; a SIGUSR1 handler sets the symbol's size to 1
 *                                       (run with CUDASIM_LOADED_SIGNAL=10: the simulator raises it once it read
 *                                       the image, before the load returns: what the driver loaded is SIZE).
 *   first_use_lies libflip SIZE N   the same with cuLibraryLoadData (CU_LIBRARY_BINARY_IS_PRESERVED) and
 *                                       cuLibraryGetGlobal.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "cq_driver.h"
#include "cq_elf.h"

#define PROG "first_use_lies"
#include "cq_fill.h"

/* A cubin in `e`: kernel `k` in .text.k, object `g` of `size` bytes in a NOBITS .nv.global; `lie` as above. */
static size_t cubin(unsigned char *e, unsigned long long size, const char *lie) {
    static const char shstr[] = "\0.shstrtab\0.strtab\0.symtab\0.nv.global\0.text.k";
    static const char strtab[] = "\0k\0g\0big";
    int overflow = strcmp(lie, "overflow") == 0, noname = strcmp(lie, "noname") == 0;
    int nsym = overflow ? 4 : 3;
    memset(e, 0, 4096);
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
    s[1] = (Elf64_Sym){.st_name = 1, .st_info = 0x12, .st_other = 0x10, .st_shndx = 5, .st_size = 16};
    s[2] = (Elf64_Sym){.st_name = 3, .st_info = 0x11, .st_shndx = 4, .st_size = size};
    if (overflow) s[3] = (Elf64_Sym){.st_name = 5, .st_info = 0x11, .st_shndx = 5, .st_size = ~0ull};
    at += nsym * sizeof *s;
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
    sh[1] = (Elf64_Shdr){.sh_name = 1, .sh_type = SHT_STRTAB, .sh_offset = o_shstr,
                         .sh_size = noname ? 1 : sizeof shstr};
    sh[2] = (Elf64_Shdr){.sh_name = 11, .sh_type = SHT_STRTAB, .sh_offset = o_str, .sh_size = sizeof strtab};
    sh[3] = (Elf64_Shdr){.sh_name = 19, .sh_type = SHT_SYMTAB, .sh_offset = o_sym, .sh_size = nsym * sizeof *s,
                         .sh_link = 2, .sh_entsize = sizeof *s};
    sh[4] = (Elf64_Shdr){.sh_name = 27, .sh_type = SHT_NOBITS, .sh_flags = noname ? 0 : SHF_ALLOC | SHF_WRITE,
                         .sh_size = size};
    sh[5] = (Elf64_Shdr){.sh_name = 38, .sh_type = SHT_PROGBITS, .sh_flags = SHF_ALLOC | SHF_EXECINSTR,
                         .sh_offset = o_text, .sh_size = 16};
    return at + 6 * sizeof *sh;
}

static unsigned char g_flip[4096];
static Elf64_Sym *g_sym;

/* The loaded image's global shrinks to 1 byte once the driver read it. */
static void flip(int sig) {
    (void)sig;
    if (g_sym) g_sym->st_size = 1;
}

/* The plain cubin in g_flip, its `.nv.global` section 4 bytes, g_sym its global's symbol. */
static void flip_image(unsigned long long size) {
    cubin(g_flip, size, "");
    g_sym = NULL;
    for (size_t at = 64; at < 512; at += 8) {
        Elf64_Sym *c = (Elf64_Sym *)(g_flip + at);
        if (c->st_name == 3 && c->st_info == 0x11) { g_sym = c; break; }
    }
    if (!g_sym) die("no symbol g", CUDA_ERROR_UNKNOWN);
    Elf64_Shdr *sec = (Elf64_Shdr *)(g_flip + ((Elf64_Ehdr *)g_flip)->e_shoff) + 4;
    sec->sh_size = 4;
}

static char g_fifo[256];
static unsigned long long g_size;
static int g_writes;

/* Whether a descriptor of this process has the FIFO open. */
static int fifo_open_here(void) {
    char link[64], to[256];
    for (int fd = 3; fd < 256; fd++) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, to, sizeof to - 1);
        if (n > 0 && (to[n] = 0, strcmp(to, g_fifo) == 0)) return 1;
    }
    return 0;
}

/* Writes the real image to the FIFO's first reader, then (once that reader closed it) a 1-byte-global one to
 * the next (g_writes of them). */
static void *writer(void *arg) {
    (void)arg;
    static unsigned char e[4096];
    for (int i = 0; i < g_writes; i++) {
        size_t n = cubin(e, i == 0 ? g_size : 1, "");
        int fd = open(g_fifo, O_WRONLY);
        if (fd < 0) return NULL;
        if (write(fd, e, n) != (ssize_t)n) perror("write");
        /* The reader's descriptor shows only once its open returned, and it sees no end before this close. */
        while (i + 1 < g_writes && !fifo_open_here()) usleep(1000);
        close(fd);
        while (i + 1 < g_writes && fifo_open_here()) usleep(1000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: first_use_lies MODE SIZE N\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long long size = cq_size(argv[2]);
    int n = atoi(argv[3]);
    signal(SIGPIPE, SIG_IGN); /* the writer's second image may find its reader gone */
    CUdevice d0;
    primary0(&d0);
    used(0, "used");
    static unsigned char image[4096];
    static char text[512];
    for (int i = 0; i < n; i++) {
        CUresult r = CUDA_SUCCESS;
        CUmodule m = NULL;
        CUdeviceptr p;
        size_t bytes;
        if (strcmp(mode, "ptxhex") == 0) {
            snprintf(text, sizeof text,
                     ".version 8.0\n.target sm_90\n.address_size 64\n.visible .global .align 1 .b8 pad[0x10];\n"
                     ".visible .global .align 1 .b8 g[%llu];\n.visible .entry k() { ret; }\n",
                     size);
            r = cuModuleLoadData(&m, text);
        } else if (strcmp(mode, "fifo") == 0 || strcmp(mode, "pipe") == 0) {
            g_writes = mode[0] == 'f' ? 2 : 1;
            snprintf(g_fifo, sizeof g_fifo, "/tmp/first_use_lies.%d.%d", (int)getpid(), i);
            unlink(g_fifo);
            if (mkfifo(g_fifo, 0600) != 0) die("mkfifo", CUDA_ERROR_UNKNOWN);
            g_size = size;
            pthread_t t;
            pthread_create(&t, NULL, writer, NULL);
            r = cuModuleLoad(&m, g_fifo);
            /* No one read the second image: a reader that comes and goes lets the writer finish. */
            while (pthread_tryjoin_np(t, NULL) != 0) {
                int fd = open(g_fifo, O_RDONLY | O_NONBLOCK);
                if (fd >= 0) close(fd);
                usleep(1000);
            }
            unlink(g_fifo);
        } else if (strcmp(mode, "flip") == 0) {
            signal(SIGUSR1, flip);
            flip_image(size);
            r = cuModuleLoadData(&m, g_flip);
        } else if (strcmp(mode, "libflip") == 0) {
            signal(SIGUSR1, flip);
            flip_image(size);
            CUlibraryOption o = CU_LIBRARY_BINARY_IS_PRESERVED;
            void *v = (void *)1;
            CUlibrary l;
            r = cuLibraryLoadData(&l, g_flip, NULL, NULL, 0, &o, &v, 1);
            if (r != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuLibraryGetGlobal(&p, &bytes, l, "g");
            printf("global.%d=%s\n", i, cq_err(r));
            used(0, "used");
            continue;
        } else if (strncmp(mode, "fat", 3) == 0) {
            static unsigned char fat[8192], other[4096];
            size_t len = cubin(image, size, "");
            int multi = strcmp(mode, "fatmulti") == 0, ptx = strcmp(mode, "fatptxjunk") == 0;
            size_t olen = multi ? cubin(other, 1, "") : 64;
            unsigned char *f = fat;
            memset(fat, 0, sizeof fat);
            size_t at = 16;
            unsigned sms[2] = {80, 90};
            for (int k = 0; k < 2; k++) {
                size_t plen = k == 0 ? olen : len;
                unsigned char *e = f + at;
                *(uint16_t *)(e + 0) = k == 0 && ptx ? 1 : 2; /* PTX or ELF */
                *(uint32_t *)(e + 4) = 64;                  /* header size */
                *(uint32_t *)(e + 8) = (uint32_t)plen;      /* payload */
                *(uint32_t *)(e + 28) = sms[k];
                if (k == 1) memcpy(e + 64, image, plen);
                else if (multi) memcpy(e + 64, other, plen);
                else memset(e + 64, 0xee, plen); /* neither ELF nor PTX */
                at += 64 + plen;
            }
            *(uint32_t *)(f + 0) = 0xBA55ED50;
            *(uint16_t *)(f + 4) = 1;
            *(uint16_t *)(f + 6) = 16;
            *(uint64_t *)(f + 8) = at - 16;
            r = cuModuleLoadData(&m, fat);
        } else if (strcmp(mode, "libfile") != 0 && strcmp(mode, "ctxcycle") != 0) {
            cubin(image, size, mode);
            r = cuModuleLoadData(&m, image);
        }
        if (strcmp(mode, "ctxcycle") == 0) {
            static CUlibrary lib;
            if (i == 0) {
                cubin(image, size, "");
                CK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
            }
            CUcontext c;
            if ((r = cuCtxCreate(&c, NULL, 0, d0)) != CUDA_SUCCESS) {
                printf("ctx.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuLibraryGetGlobal(&p, &bytes, lib, "g");
            printf("global.%d=%s\n", i, cq_err(r));
            used(0, "used");
            CK(cuCtxDestroy(c));
            CK(cuCtxSetCurrent(primary0(&d0)));
            continue;
        }
        if (strcmp(mode, "libfile") == 0) {
            snprintf(g_fifo, sizeof g_fifo, "/tmp/first_use_lies.%d.cubin", (int)getpid());
            size_t len = cubin(image, size, "");
            FILE *f = fopen(g_fifo, "wb");
            if (!f || fwrite(image, 1, len, f) != len || fclose(f) != 0) die("write the cubin", CUDA_ERROR_UNKNOWN);
            CUlibrary l;
            r = cuLibraryLoadFromFile(&l, g_fifo, NULL, NULL, 0, NULL, NULL, 0);
            unlink(g_fifo);
            if (r != CUDA_SUCCESS) {
                printf("load.%d=%s\n", i, cq_err(r));
                break;
            }
            r = cuLibraryGetGlobal(&p, &bytes, l, "g");
            printf("global.%d=%s\n", i, cq_err(r));
            used(0, "used");
            continue;
        }
        if (r != CUDA_SUCCESS) {
            printf("load.%d=%s\n", i, cq_err(r));
            break;
        }
        r = cuModuleGetGlobal(&p, &bytes, m, "g");
        printf("global.%d=%s\n", i, cq_err(r));
        used(0, "used");
        if (strcmp(mode, "reload") == 0) CK(cuModuleUnload(m));
    }
    fill(64ull << 20);
    return 0;
}
