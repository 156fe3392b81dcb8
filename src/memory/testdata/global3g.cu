// The source of the fat binaries beside it, built by nvcc 13.0.88 (.deps/cu13):
//   nvcc -arch=sm_90 -fatbin global3g.cu -o global3g_default.fatbin               (cubin plain, PTX zstd: nvcc's default)
//   nvcc -arch=sm_90 -fatbin -Xfatbin -compress-all global3g.cu -o global3g_zstd.fatbin   (flags 0x8000)
//   nvcc -arch=sm_90 -fatbin --compress-mode=speed -Xfatbin -compress-all global3g.cu -o global3g_lz4.fatbin (0x2000)
__device__ char big[3ull << 30];
__device__ int small_g[1024];
__global__ void k(int *o) { o[threadIdx.x] = big[threadIdx.x * 4096] + small_g[threadIdx.x]; }
