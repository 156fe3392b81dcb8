/* cq_elf.h: finding a function by reading a loaded library's own dynamic symbol table. */
#ifndef CQ_ELF_H
#define CQ_ELF_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

/* A symbol defined by the object behind `handle` (not its dependencies), read from the object's own dynamic
 * symbol table (found through dlinfo's link map): what a tenant that parses the library's ELF itself gets. No
 * interposer can redirect it (libcuquota.so hooks dlsym and dlvsym), so the tests use it to see the truth. */
__attribute__((unused)) static void *cq_elf_sym(void *handle, const char *name) {
    struct link_map *lm = NULL;
    if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm) return NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    const ElfW(Half) *versym = NULL;
#define CQ_PTR(v) ((uintptr_t)(v) < lm->l_addr ? (uintptr_t)(v) + lm->l_addr : (uintptr_t)(v))
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)CQ_PTR(d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)CQ_PTR(d->d_un.d_ptr); break;
        case DT_GNU_HASH: gnu = (const uint32_t *)CQ_PTR(d->d_un.d_ptr); break;
        case DT_HASH: sysv = (const uint32_t *)CQ_PTR(d->d_un.d_ptr); break;
        case DT_VERSYM: versym = (const ElfW(Half) *)CQ_PTR(d->d_un.d_ptr); break;
        }
    }
#undef CQ_PTR
    if (!symtab || !strtab) return NULL;
#define CQ_MATCH(i)                                                                                             \
    (symtab[i].st_shndx != SHN_UNDEF && symtab[i].st_value != 0 && strcmp(strtab + symtab[i].st_name, name) == 0 \
     && !(versym && (versym[i] & 0x8000)))
    if (gnu) {
        uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
        const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gnu + 4) + bloom_size);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t h = 5381;
        for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = h * 33 + *c;
        for (uint32_t i = buckets[h % nbuckets]; i >= symoffset && i != 0; i++) {
            uint32_t ch = chain[i - symoffset];
            if ((ch | 1) == (h | 1) && CQ_MATCH(i)) return (void *)(lm->l_addr + symtab[i].st_value);
            if (ch & 1) break;
        }
    } else if (sysv) {
        uint32_t nbucket = sysv[0], h = 0;
        const uint32_t *bucket = sysv + 2, *chain = bucket + nbucket;
        for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
            h = (h << 4) + *c;
            uint32_t g = h & 0xf0000000u;
            if (g) h ^= g >> 24;
            h &= ~g;
        }
        for (uint32_t i = bucket[h % nbucket]; i != 0; i = chain[i])
            if (CQ_MATCH(i)) return (void *)(lm->l_addr + symtab[i].st_value);
    }
#undef CQ_MATCH
    return NULL;
}
#endif
