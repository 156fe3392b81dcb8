"""PyTorch (torch 2.15, CUDA 13.2 build) under cuquota: memory with each of its three allocators in three modes
(no cuquota, cuquota without limits, a 1 GiB cap), and its kernels — elementwise, conv2d (cuDNN), matmul
(cuBLAS) — under an SM limit of 30 %."""
import pytest

import checks
import harness as h

ALLOCATORS = {
    "caching": None,
    "expandable": "expandable_segments:True",  # virtual memory management (cuMemCreate / cuMemMap)
    "async": "backend:cudaMallocAsync",  # stream-ordered pools
}
MODES = ("bare", "shim", "cap")


@pytest.fixture(scope="module", params=[(a, m) for a in ALLOCATORS for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def mem_run(request, tmp_path_factory):
    h.require_module("torch")
    allocator, mode = request.param
    box = h.Box(tmp_path_factory.mktemp(f"torch-{allocator}-{mode}"))
    env = {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATORS[allocator]} if ALLOCATORS[allocator] else {}
    run = h.run_worker(box, "torch_worker.py", checks.STEPS, mode, env)
    if allocator != "caching":
        assert run.step("info")["backend"] == ("cudaMallocAsync" if allocator == "async" else "native")
    return run


def test_device_size_and_free_memory(mem_run):
    checks.device_size_and_free(mem_run)


def test_oom_is_torch_error_exactly_at_the_limit(mem_run):
    checks.oom_at_the_limit(mem_run, "torch.OutOfMemoryError")


def test_memory_comes_back_after_empty_cache(mem_run):
    checks.memory_comes_back(mem_run)


def test_host_device_copies(mem_run):
    checks.copies(mem_run)


def test_nvml_process_list(mem_run):
    p = checks.nvml_process_list(mem_run)
    assert str(p["pid"]) in p["listing"], f"torch.cuda.list_gpu_processes: {p['listing']}"


def test_profiler_start_stop(mem_run):
    checks.profiler(mem_run)


# --- SM limit -------------------------------------------------------------------------------------------
# The share is the device time the process got over its loop, read from the simulator's timeline by a
# separate observer; on a real GPU, the kernel rate against the no-cuquota baseline of the same run.
# Elementwise: 10 000 launches of x.add_(1) on 1 Mi floats, 160 µs of device time each on the simulated
# 132-SM GPU (~5 s at 30 %); conv2d: 160 µs per call.

LOOPS = {
    "elementwise": ("loop:10000:1048576", "loop"),
    "conv2d": ("conv:2500", "conv"),  # cuDNN
    "matmul": ("matmul:2500", "matmul"),  # cuBLAS
}
if h.REAL:
    # A real GPU runs these shapes in a few µs, faster than Python launches them: the loops would measure the
    # CPU. Shapes of ~0.1-1 ms on an H100 keep the device the bottleneck (to be confirmed on the first GPU run).
    LOOPS = {
        "elementwise": ("loop:2000:67108864", "loop"),
        "conv2d": ("conv:1000:32:64:128", "conv"),
        "matmul": ("matmul:1000:2048", "matmul"),
    }
MATMUL_XFAIL = (
    "cuBLAS GEMM needs private driver interfaces nobody has documented (TOOLS_TLS 42d85a81-… slot 2 and "
    "table 21318c60-… slot 4, see shim-tests/sim/README.md): cublasGemmEx returns NOT_SUPPORTED on the simulator"
)


class CublasGemmGap(Exception):
    """The simulator's documented cuBLAS gap, and only it (any other failure of the test is a failure)."""


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    h.require_module("torch")
    cache = {}

    def get(kind, mode):
        if (kind, mode) not in cache:
            box = h.Box(tmp_path_factory.mktemp(f"torch-{kind}-{mode}"))
            cache[(kind, mode)] = h.run_worker(box, "torch_worker.py", [LOOPS[kind][0]], mode)
        run = cache[(kind, mode)]
        error = run.steps.get(LOOPS[kind][1], {}).get("error", "")
        if kind == "matmul" and not h.REAL and "CUBLAS_STATUS_NOT_SUPPORTED" in error:
            raise CublasGemmGap(error)
        return run.step(LOOPS[kind][1])

    return get


@pytest.mark.parametrize(
    "kind",
    [
        "elementwise",
        "conv2d",
        pytest.param(
            "matmul",
            marks=pytest.mark.xfail(not h.REAL, reason=MATMUL_XFAIL, raises=CublasGemmGap, strict=True),
        ),
    ],
)
def test_kernels_get_their_sm_share(kind, loops):
    base = loops(kind, "bare") if h.REAL else None
    s = checks.sm_share(loops(kind, "sm30"), base)
    print(f"torch {kind} under CUDA_DEVICE_SM_LIMIT=30: {s:.3f}")


def test_unlimited_loop_keeps_the_device_busy(loops):
    """Without cuquota the elementwise loop fills the device: the limit, not the launch rate, sets the share."""
    base = loops("elementwise", "bare")
    if not h.REAL:
        assert h.share(base) >= 0.85, f"share {h.share(base):.3f}"
    assert h.rate(base) > 0


# --- elastic memory (issue 39) ----------------------------------------------------------------------------
# Under a 1 GiB limit above a 64 MiB request, the worker idles between training steps while the test asks for
# the eviction as the agent does; a run never asked is the control whose bytes every run must match. The
# caching allocator's segments (cudaMalloc) move to host memory and come back; expandable segments are the
# program's own VMM, which the shim leaves resident (docs/elastic-memory.md): nothing moves, nothing breaks.


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    h.require_module("torch")
    cache = {}

    def get(allocator, evict):
        if (allocator, evict) not in cache:
            box = h.Box(tmp_path_factory.mktemp(f"torch-elastic-{allocator}-{evict}"))
            env = {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATORS[allocator]} if ALLOCATORS[allocator] else {}
            cache[(allocator, evict)] = checks.elastic_run(
                box, "torch_worker.py", env, evict, movable=allocator == "caching"
            )
        return cache[(allocator, evict)]

    return get


@pytest.mark.parametrize("allocator", ["caching", "expandable"])
def test_training_goes_on_with_its_memory_evicted_and_restored(allocator, elastic):
    base, run = elastic("caching", False), elastic(allocator, True)
    checks.evicted_and_restored(base, run, allocator == "caching", f"torch {allocator}")
