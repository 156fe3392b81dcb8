/* resolve_audit: an LD_AUDIT library that vetoes loading any object whose file name contains "libcuquota" (the
 * dynamic loader asks audit libraries before it opens each object, preloads included): what a tenant that
 * re-executes itself with LD_AUDIT set does to the preload. */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <string.h>

unsigned int la_version(unsigned int version) {
    (void)version;
    return LAV_CURRENT;
}

char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    (void)cookie;
    (void)flag;
    const char *base = strrchr(name, '/');
    return strstr(base ? base + 1 : name, "libcuquota") ? NULL : (char *)name;
}
