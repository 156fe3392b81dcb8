"""cuda-python (cuda-bindings 13.0.3: the driver API from Python) under cuquota: cuMemAlloc in three modes,
cuProfilerStart/Stop, and an NVRTC-compiled kernel (PTX loaded with cuModuleLoadData) under an SM limit."""
import pytest

import checks
import harness as h

MODES = ("bare", "shim", "cap")


@pytest.fixture(scope="module", params=MODES)
def mem_run(request, tmp_path_factory):
    h.require_module("cuda.bindings")
    box = h.Box(tmp_path_factory.mktemp(f"cudapy-{request.param}"))
    return h.run_worker(box, "cudapy_worker.py", checks.STEPS, request.param)


def test_device_size_and_free_memory(mem_run):
    checks.device_size_and_free(mem_run)


def test_oom_is_cuda_error_out_of_memory_exactly_at_the_limit(mem_run):
    checks.oom_at_the_limit(mem_run, "CUresult.CUDA_ERROR_OUT_OF_MEMORY")


def test_memory_comes_back_after_cu_mem_free(mem_run):
    checks.memory_comes_back(mem_run)


def test_host_device_copies(mem_run):
    checks.copies(mem_run)


def test_nvml_process_list(mem_run):
    checks.nvml_process_list(mem_run)


def test_profiler_start_stop(mem_run):
    checks.profiler(mem_run)


# 528 blocks of 256 threads: 4 waves = 80 µs on the simulated 132-SM GPU.
LOOP = "loop:10000:528" if not h.REAL else "loop:2000:262144"  # real GPU: 67 Mi threads, ~0.1 ms


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    h.require_module("cuda.bindings")
    cache = {}

    def get(mode):
        if mode not in cache:
            box = h.Box(tmp_path_factory.mktemp(f"cudapy-loop-{mode}"))
            cache[mode] = h.run_worker(box, "cudapy_worker.py", [LOOP], mode)
        return cache[mode].step("loop")

    return get


def test_kernel_loop_gets_its_sm_share(loops):
    s = checks.sm_share(loops("sm30"), loops("bare") if h.REAL else None)
    print(f"cuda-python kernel under CUDA_DEVICE_SM_LIMIT=30: {s:.3f}")


def test_unlimited_loop_keeps_the_device_busy(loops):
    base = loops("bare")
    if not h.REAL:
        assert h.share(base) >= 0.85, f"share {h.share(base):.3f}"
