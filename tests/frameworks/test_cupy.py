"""CuPy (cupy-cuda13x 14.2) under cuquota: its memory pool in three modes, and its NVRTC-compiled elementwise
kernels under an SM limit of 30 %."""
import pytest

import checks
import harness as h

MODES = ("bare", "shim", "cap")


@pytest.fixture(scope="module", params=MODES)
def mem_run(request, tmp_path_factory):
    h.require_module("cupy")
    box = h.Box(tmp_path_factory.mktemp(f"cupy-{request.param}"))
    return h.run_worker(box, "cupy_worker.py", checks.STEPS, request.param)


def test_device_size_and_free_memory(mem_run):
    checks.device_size_and_free(mem_run)
    info = mem_run.step("info")
    assert info["device_free"] == info["free"] or h.REAL


def test_oom_is_cupy_error_exactly_at_the_limit(mem_run):
    checks.oom_at_the_limit(mem_run, "cupy.cuda.memory.OutOfMemoryError")


def test_memory_comes_back_after_free_all_blocks(mem_run):
    checks.memory_comes_back(mem_run)


def test_host_device_copies(mem_run):
    checks.copies(mem_run)


def test_nvml_process_list(mem_run):
    checks.nvml_process_list(mem_run)


def test_profiler_start_stop(mem_run):
    checks.profiler(mem_run)


# x += 1 on 64 Ki floats: CuPy launches 512 blocks of 128 threads, 4 waves = 80 µs on the simulated GPU.
LOOP = "loop:10000:65536" if not h.REAL else "loop:2000:67108864"  # real GPU: ~0.1 ms per kernel


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    h.require_module("cupy")
    cache = {}

    def get(mode):
        if mode not in cache:
            box = h.Box(tmp_path_factory.mktemp(f"cupy-loop-{mode}"))
            cache[mode] = h.run_worker(box, "cupy_worker.py", [LOOP], mode)
        return cache[mode].step("loop")

    return get


def test_elementwise_kernels_get_their_sm_share(loops):
    s = checks.sm_share(loops("sm30"), loops("bare") if h.REAL else None)
    print(f"cupy elementwise under CUDA_DEVICE_SM_LIMIT=30: {s:.3f}")


def test_unlimited_loop_keeps_the_device_busy(loops):
    base = loops("bare")
    if not h.REAL:
        assert h.share(base) >= 0.85, f"share {h.share(base):.3f}"


# Elastic memory (issue 39; see test_torch.py): the memory pool's blocks move to host memory while the worker
# idles, and come back for its next steps with every byte.
def test_memory_pool_evicted_and_restored_between_steps(tmp_path_factory):
    h.require_module("cupy")
    base, run = (
        checks.elastic_run(h.Box(tmp_path_factory.mktemp(f"cupy-elastic-{evict}")), "cupy_worker.py", None, evict)
        for evict in (False, True)
    )
    checks.evicted_and_restored(base, run, True, "cupy pool")
