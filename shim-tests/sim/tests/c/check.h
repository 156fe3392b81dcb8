/* check.h: what the simulator's C test programs share: CHECK counts a failed condition (the program prints OK
 * only when there was none), CU checks a driver call. */
#ifndef CHECK_H
#define CHECK_H
#include <cuda.h>
#include <stdio.h>

static int failures = 0;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                              \
        }                                                                            \
    } while (0)
#define CU(call) CHECK((call) == CUDA_SUCCESS)
#define MB (1024ull * 1024ull)
#endif
