/* Smoke test of the simulator through NVIDIA's real headers: compiled against cuda.h / nvml.h, linked with
 * -l:libcuda.so.1 -l:libnvidia-ml.so.1 (both symlinks to libcudasim.so). Run by tests/smoke.rs with
 * CUDASIM_DEVICES=2 CUDASIM_MEMORY=1g,2g CUDASIM_SMS=4 CUDASIM_CTX_OVERHEAD=64m; argv[1] = "all" or
 * "visible" (run with CUDA_VISIBLE_DEVICES=1). Prints "OK" on success; every failed check prints its line. */
#include <cuda.h>
#include <nvml.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"


static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t used_now(void) {
    size_t f = 0, t = 0;
    CU(cuMemGetInfo(&f, &t));
    return t - f;
}

static void visible_run(void) {
    int n = -1;
    size_t total = 0;
    unsigned int nn = 0;
    CU(cuInit(0));
    CU(cuDeviceGetCount(&n));
    CHECK(n == 1);
    CU(cuDeviceTotalMem(&total, 0));
    CHECK(total == 2048 * MB);
    CHECK(cuDeviceTotalMem(&total, 1) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHECK(nvmlDeviceGetCount_v2(&nn) == NVML_SUCCESS && nn == 2);
}

int main(int argc, char **argv) {
    int n = 0, v = 0, sms = 0, major = 0;
    char name[128];
    CUuuid uuid;
    size_t total = 0;
    CUcontext ctx = NULL, cur = NULL;

    if (argc > 1 && strcmp(argv[1], "visible") == 0) {
        visible_run();
        if (failures == 0) printf("OK\n");
        return failures != 0;
    }

    /* Before cuInit. */
    CU(cuDriverGetVersion(&v));
    CHECK(v == 13000);
    CHECK(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
    CU(cuInit(0));

    /* A child forked after cuInit cannot use the parent's driver state (as on a real GPU). */
    {
        pid_t child = fork();
        if (child == 0) {
            int c = 0;
            _exit(cuDeviceGetCount(&c) == CUDA_ERROR_NOT_INITIALIZED && cuInit(0) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
        }
        int status = -1;
        CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    /* Devices. */
    CU(cuDeviceGetCount(&n));
    CHECK(n == 2);
    CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    CHECK(sms == 4);
    CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
    CHECK(major == 9);
    CHECK(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 7) == CUDA_ERROR_INVALID_DEVICE);
    CU(cuDeviceGetName(name, sizeof name, 0));
    CHECK(strstr(name, "NVIDIA") != NULL);
    CU(cuDeviceGetUuid(&uuid, 1));
    CU(cuDeviceTotalMem(&total, 1));
    CHECK(total == 2048 * MB);

    /* Contexts: the primary context costs CUDASIM_CTX_OVERHEAD. */
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    CU(cuCtxGetCurrent(&cur));
    CHECK(cur == ctx);
    CHECK(used_now() == 64 * MB);
    CHECK(cuMemGetInfo(NULL, &total) == CUDA_ERROR_INVALID_VALUE);

    /* Memory: granularity, data round trip, unknown free, out of memory. */
    {
        CUdeviceptr a = 0, b = 0, big = 0;
        char in[64] = "hello, simulated gpu", out[64] = {0};
        unsigned int words[4] = {0};
        CU(cuMemAlloc(&a, 1));
        CHECK(a != 0);
        CHECK(used_now() == 66 * MB);
        CU(cuMemAlloc(&b, 64));
        CHECK(a != b);
        CU(cuMemcpyHtoD(b, in, sizeof in));
        CU(cuMemcpyDtoH(out, b, sizeof out));
        CHECK(memcmp(in, out, sizeof in) == 0);
        CU(cuMemsetD32(b, 0xdeadbeef, 4));
        CU(cuMemcpyDtoH(words, b, sizeof words));
        CHECK(words[0] == 0xdeadbeef && words[3] == 0xdeadbeef);
        CHECK(cuMemcpyHtoD(b, in, 64 * MB) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cuMemFree(b + 8) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cuMemFree(0x1234000) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cuMemAlloc(&big, 1024 * MB) == CUDA_ERROR_OUT_OF_MEMORY);
        CU(cuMemAlloc(&big, 1024 * MB - 68 * MB));
        CHECK(used_now() == 1024 * MB);
        CU(cuMemFree(big));
        CU(cuMemFree(a));
        CU(cuMemFree(b));
        CHECK(used_now() == 64 * MB);
    }

    /* cuGetProcAddress returns the exported symbols. */
    {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 99;
        CHECK(lib != NULL && nvml == lib);
        CU(cuGetProcAddress("cuMemAlloc", &fn, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &st));
        CHECK(fn == dlsym(lib, "cuMemAlloc_v2") && st == CU_GET_PROC_ADDRESS_SUCCESS);
        CU(cuGetProcAddress("cuMemAlloc", &fn, 2000, 0, NULL));
        CHECK(fn == dlsym(lib, "cuMemAlloc"));
        CU(cuGetProcAddress("cuMemcpyHtoD", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
        CHECK(fn == dlsym(lib, "cuMemcpyHtoD_v2_ptds"));
        CU(cuGetProcAddress("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st));
        CHECK(fn == dlsym(lib, "cuLaunchKernel"));
        CU(cuGetProcAddress("cuGraphInstantiate", &fn, 12000, 0, &st));
        CHECK(fn == dlsym(lib, "cuGraphInstantiateWithFlags"));
        CHECK(cuGetProcAddress("cuNoSuchFunction", &fn, 12000, 0, &st) == CUDA_ERROR_NOT_FOUND);
        CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        CHECK(cuGetProcAddress("cuMemAlloc", &fn, 1000, 0, &st) == CUDA_ERROR_NOT_FOUND);
        CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        /* A known but unimplemented function: found, and answers NOT_SUPPORTED. */
        CU(cuGetProcAddress("cuGraphicsMapResources", &fn, 12000, 0, &st));
        CHECK(fn != NULL && fn == dlsym(lib, "cuGraphicsMapResources"));
        CHECK(((CUresult(*)(unsigned int, CUgraphicsResource *, CUstream))fn)(0, NULL, 0) == CUDA_ERROR_NOT_SUPPORTED);
    }

    /* Kernels: 10 ms per wave; 8 blocks on 4 SMs = 2 waves (long enough to be robust on a loaded machine). */
    {
        const char *image = "CUDASIM-MODULE 1\nkernel spin 10000000\n";
        CUmodule mod;
        CUfunction f;
        CUevent e0, e1;
        CUstream s;
        float ms = 0;
        double t0;
        CU(cuModuleLoadData(&mod, image));
        CHECK(used_now() == 66 * MB); /* module overhead 2m */
        CU(cuModuleGetFunction(&f, mod, "spin"));
        CHECK(cuModuleGetFunction(&f, mod, "nope") == CUDA_ERROR_NOT_FOUND);
        CU(cuModuleGetFunction(&f, mod, "spin"));
        CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU(cuEventCreate(&e0, 0));
        CU(cuEventCreate(&e1, 0));
        t0 = now_ms();
        CU(cuEventRecord(e0, s));
        CU(cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
        CU(cuEventRecord(e1, s));
        CHECK(cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
        CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
        CHECK(now_ms() - t0 < 15); /* launches are asynchronous */
        CU(cuEventSynchronize(e1));
        CHECK(now_ms() - t0 >= 19.9);
        CU(cuEventElapsedTime(&ms, e0, e1));
        CHECK(ms >= 19.9 && ms < 26);
        CU(cuStreamQuery(s));
        CHECK(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);

        /* Graph capture: 3 kernels of 1 wave, launched twice = 60 ms. */
        {
            CUgraph g;
            CUgraphExec ge;
            CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            for (int i = 0; i < 3; i++) CU(cuLaunchKernel(f, 4, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
            CU(cuStreamEndCapture(s, &g));
            CU(cuGraphInstantiate(&ge, g, 0));
            CU(cuEventRecord(e0, s));
            CU(cuGraphLaunch(ge, s));
            CU(cuGraphLaunch(ge, s));
            CU(cuEventRecord(e1, s));
            CU(cuStreamSynchronize(s));
            CU(cuEventElapsedTime(&ms, e0, e1));
            CHECK(ms >= 59.9 && ms < 66);
            CU(cuGraphExecDestroy(ge));
            CU(cuGraphDestroy(g));
        }

        /* NVML follows the timeline and the memory. */
        {
            nvmlDevice_t d;
            nvmlUtilization_t u;
            nvmlMemory_t m;
            nvmlMemory_v2_t m2;
            nvmlProcessInfo_v1_t p1[4];
            nvmlProcessInfo_t p3[4];
            nvmlProcessUtilizationSample_t samples[64];
            unsigned int cnt = 0, ndev = 0;
            char uu[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            CHECK(nvmlDeviceGetCount_v2(&ndev) == NVML_ERROR_UNINITIALIZED);
            CHECK(nvmlInit_v2() == NVML_SUCCESS);
            CHECK(nvmlDeviceGetCount_v2(&ndev) == NVML_SUCCESS && ndev == 2);
            CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS);
            CHECK(nvmlDeviceGetUUID(d, uu, sizeof uu) == NVML_SUCCESS && strncmp(uu, "GPU-", 4) == 0);
            CHECK(nvmlDeviceGetMemoryInfo(d, &m) == NVML_SUCCESS);
            CHECK(m.total == 1024 * MB && m.used == 66 * MB && m.free == m.total - m.used);
            m2.version = 1;
            CHECK(nvmlDeviceGetMemoryInfo_v2(d, &m2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
            m2.version = nvmlMemory_v2;
            CHECK(nvmlDeviceGetMemoryInfo_v2(d, &m2) == NVML_SUCCESS);
            CHECK(m2.total == m2.free + m2.used + m2.reserved && m2.used == 66 * MB);
            cnt = 0;
            /* nvml.h maps the bare name to _v3: reach the v1 symbol (16-byte entries) as old binaries do. */
            {
                typedef nvmlReturn_t (*v1_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
                v1_fn v1 = (v1_fn)dlsym(RTLD_DEFAULT, "nvmlDeviceGetComputeRunningProcesses");
                CHECK(v1 != NULL);
                CHECK(v1(d, &cnt, NULL) == NVML_ERROR_INSUFFICIENT_SIZE && cnt == 1);
                cnt = 4;
                CHECK(v1(d, &cnt, p1) == NVML_SUCCESS && cnt == 1);
            }
            CHECK(p1[0].pid == (unsigned)getpid() && p1[0].usedGpuMemory == 66 * MB);
            cnt = 4;
            CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &cnt, p3) == NVML_SUCCESS && cnt == 1);
            CHECK(p3[0].pid == (unsigned)getpid() && p3[0].usedGpuMemory == 66 * MB);
            CHECK(nvmlDeviceGetUtilizationRates(d, &u) == NVML_SUCCESS && u.gpu > 0);
            cnt = 64;
            CHECK(nvmlDeviceGetProcessUtilization(d, samples, &cnt, 0) == NVML_SUCCESS);
            {
                /* Samples cover the last second: an earlier process on this state file may be there too. */
                int mine = -1;
                for (unsigned int i = 0; i < cnt; i++)
                    if (samples[i].pid == (unsigned)getpid()) mine = (int)i;
                CHECK(mine >= 0 && samples[mine].smUtil > 0 && samples[mine].timeStamp > 0);
            }
            CHECK(nvmlDeviceGetMemoryInfo(d, NULL) == NVML_ERROR_INVALID_ARGUMENT);
            CHECK(nvmlShutdown() == NVML_SUCCESS);
        }
        CU(cuModuleUnload(mod));
        CHECK(used_now() == 64 * MB);
        CU(cuStreamDestroy(s));
    }

    /* Pools keep freed memory reserved until a synchronisation releases it (threshold 0). */
    {
        CUmemoryPool pool;
        CUdeviceptr p;
        cuuint64_t reserved = 0, used = 0;
        CU(cuDeviceGetDefaultMemPool(&pool, 0));
        CU(cuMemAllocAsync(&p, MB, 0));
        CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
        CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
        CHECK(reserved == 2 * MB && used == 2 * MB);
        CU(cuMemFreeAsync(p, 0));
        CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
        CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
        CHECK(reserved == 2 * MB && used == 0);
        CHECK(used_now() == 66 * MB);
        CU(cuStreamSynchronize(0));
        CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
        CHECK(reserved == 0);
        CHECK(used_now() == 64 * MB);
    }

    /* Arrays: the requirement is what is charged. */
    {
        CUDA_ARRAY3D_DESCRIPTOR d = {0};
        CUDA_ARRAY_MEMORY_REQUIREMENTS req;
        CUarray arr;
        d.Width = 1024;
        d.Height = 1024;
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        CU(cuArray3DCreate(&arr, &d));
        CU(cuArrayGetMemoryRequirements(&req, arr, 0));
        CHECK(req.size == 16 * MB);
        CHECK(used_now() == 80 * MB);
        CU(cuArrayDestroy(arr));
        CHECK(used_now() == 64 * MB);
    }

    /* Virtual memory management: data written through one mapping reads back. */
    {
        CUmemAllocationProp prop = {0};
        CUmemAccessDesc acc = {0};
        CUmemGenericAllocationHandle hdl;
        CUdeviceptr va;
        size_t gran = 0;
        char in[16] = "vmm bytes", out[16] = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CHECK(gran == 2 * MB);
        CHECK(cuMemCreate(&hdl, MB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
        CU(cuMemCreate(&hdl, 4 * MB, &prop, 0));
        CHECK(used_now() == 68 * MB);
        CU(cuMemAddressReserve(&va, 8 * MB, 0, 0, 0));
        CU(cuMemMap(va, 4 * MB, 0, hdl, 0));
        CHECK(cuMemcpyHtoD(va, in, sizeof in) == CUDA_ERROR_INVALID_VALUE); /* no access yet */
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cuMemSetAccess(va, 4 * MB, &acc, 1));
        CU(cuMemcpyHtoD(va + MB, in, sizeof in));
        CU(cuMemcpyDtoH(out, va + MB, sizeof out));
        CHECK(memcmp(in, out, sizeof in) == 0);
        CU(cuMemRelease(hdl));
        CHECK(used_now() == 68 * MB); /* still mapped */
        CU(cuMemUnmap(va, 4 * MB));
        CHECK(used_now() == 64 * MB);
        CU(cuMemAddressFree(va, 8 * MB));
    }

    /* A retained handle needs its own release: the memory lives until every reference is released and every
     * mapping unmapped (cuda.h, cuMemRetainAllocationHandle and cuMemRelease). */
    {
        CUmemAllocationProp prop = {0};
        CUmemAccessDesc acc = {0};
        CUmemGenericAllocationHandle hdl, again = 0;
        CUdeviceptr va;
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CU(cuMemCreate(&hdl, 4 * MB, &prop, 0));
        CU(cuMemAddressReserve(&va, 8 * MB, 0, 0, 0));
        CU(cuMemMap(va, 4 * MB, 0, hdl, 0));
        CU(cuMemMap(va + 4 * MB, 4 * MB, 0, hdl, 0));
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cuMemSetAccess(va, 8 * MB, &acc, 1));
        CU(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(va + 5 * MB)));
        CHECK(again == hdl); /* the same handle value */
        CU(cuMemRelease(hdl));
        CU(cuMemUnmap(va, 4 * MB));
        CHECK(used_now() == 68 * MB); /* one mapping and the retained reference left */
        CU(cuMemUnmap(va + 4 * MB, 4 * MB));
        CHECK(used_now() == 68 * MB); /* the retained reference */
        CHECK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)va) == CUDA_ERROR_INVALID_VALUE);
        CU(cuMemRelease(hdl));
        CHECK(used_now() == 64 * MB);
        CHECK(cuMemRelease(hdl) == CUDA_ERROR_INVALID_VALUE);
        CU(cuMemAddressFree(va, 8 * MB));
    }

    /* A created context costs overhead until destroyed; destroying frees its memory. */
    {
        CUcontext c2;
        CUdeviceptr p;
        CU(cuCtxCreate(&c2, NULL, 0, 1));
        CU(cuCtxGetCurrent(&cur));
        CHECK(cur == c2);
        CU(cuMemAlloc(&p, 10 * MB));
        CHECK(used_now() == 64 * MB + 10 * MB);
        CU(cuCtxDestroy(c2));
        CU(cuCtxGetCurrent(&cur));
        CHECK(cur == ctx);
    }

    /* A stream holds at most 1024 pending kernels: the 1025th launch sleeps until the oldest completes. */
    {
        const char *image = "CUDASIM-MODULE 1\nkernel ms 1000000\n";
        CUmodule mod;
        CUfunction f;
        CUstream s;
        double t0, t1;
        CU(cuModuleLoadData(&mod, image));
        CU(cuModuleGetFunction(&f, mod, "ms"));
        CU(cuStreamCreate(&s, 0));
        t0 = now_ms();
        for (int i = 0; i < 1100; i++) CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        t1 = now_ms();
        /* ~76 launches had to wait about 1 ms each (fewer if launching itself took a while). */
        CHECK(t1 - t0 >= 30);
        CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
        CU(cuStreamSynchronize(s));
        CHECK(now_ms() - t0 >= 1099);
        CU(cuStreamDestroy(s));
        CU(cuModuleUnload(mod));
    }

    CU(cuDevicePrimaryCtxRelease(0));
    if (failures == 0) printf("OK\n");
    return failures != 0;
}
