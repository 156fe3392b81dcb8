"""The checks every framework's memory scenario must pass (used by test_torch / test_cupy / test_cuda_python).

A memory scenario is one worker running `info`, `oom:<chunk MiB>`, `free`, `copy`, `procs`, `profiler` in
one mode (bare, shim, cap); its `Run` carries, for each checkpoint, what the observer saw at that moment.
On the simulator the expected numbers are exact; on a real GPU, where the driver's and NVML's accounting of
its own reservations differ, the no-cuquota comparisons get a 1 GiB band (the cap's are still exact: cuquota
computes them).
"""
import harness as h
from harness import CAP, MiB, REAL, SIM_CTX, SIM_MEMORY, SIM_MODULE

# cudaMemGetInfo and NVML account for the driver's own reservation differently (hundreds of MiB on an H100).
REAL_BAND = 1024 * MiB
CHUNK_MIB = 64
STEPS = ["info", f"oom:{CHUNK_MIB}", "free", "copy", "procs", "profiler"]


def limit(run):
    """The memory the process must see as its GPU's size: the cap, or the device."""
    if run.mode == "cap":
        return CAP
    return run.step("info")["device_total"] if REAL else SIM_MEMORY


def exact(run):
    return not REAL or run.mode == "cap"


def modules_beyond(used, base):
    """On the simulator a process holds its context, what it allocated, and 2 MiB per module it loaded:
    returns how many modules `used` holds beyond `base`, failing if the rest is not whole modules."""
    extra = used - base
    assert extra >= 0 and extra % SIM_MODULE == 0 and extra // SIM_MODULE <= 64, (
        f"the process holds {used} B: {extra} B beyond what it allocated and its context is not whole modules"
    )
    return extra // SIM_MODULE


def free_matches(run, step):
    used = h.used_view(run.mode, step["observed"])
    if exact(run):
        assert step["free"] == limit(run) - used, f"free {step['free']}, limit {limit(run)}, used {used}"
    else:
        assert abs(step["free"] - (step["total"] - used)) <= REAL_BAND


def device_size_and_free(run):
    info = run.step("info")
    assert info["device_total"] == info["total"] == limit(run), "device size as the framework reports it"
    free_matches(run, info)


def oom_at_the_limit(run, error_type):
    oom = run.step("oom")
    assert oom["framework_oom"], f"{oom['error_type']}: {oom.get('message', '')}"
    assert oom["error_type"] == error_type
    assert oom["chunks"] >= 1
    obs = oom["observed"]
    used = h.used_view(run.mode, obs)
    lim = limit(run)
    if not exact(run):
        assert oom["free"] < oom["chunk"] + REAL_BAND
        return
    # Stopped at the limit: nothing over it, and not a chunk's worth left under it.
    assert used <= lim, f"{used - lim} B over the limit"
    assert lim - used < oom["chunk"], f"stopped {lim - used} B below the limit"
    assert oom["free"] == lim - used
    if REAL:
        return
    # What the region charges is exactly what the driver holds: the framework's reservation, the context
    # and the modules it loaded.
    truth = obs["procs"][run.pid]
    if run.mode != "bare":
        assert obs["region_procs"].get(run.pid) == truth == obs["region_used"], (obs, truth)
    modules_beyond(truth, oom["reserved"] + SIM_CTX)


def memory_comes_back(run):
    free = run.step("free")
    assert free["reserved"] == 0, "the framework still holds memory"
    free_matches(run, free)
    if not REAL:
        obs = free["observed"]
        truth = obs["procs"][run.pid]
        modules_beyond(truth, SIM_CTX)  # only the context and modules are left
        if run.mode != "bare":
            assert obs["region_used"] == truth


def copies(run):
    c = run.step("copy")
    assert c["h2d_d2h"] and c["d2d"] and c["pinned_async"], c


def nvml_process_list(run):
    p = run.step("procs")
    procs = dict(p["procs"])
    assert p["pid"] in procs, f"own pid missing from NVML's list: {p['procs']}"
    truth = p["observed"]["procs"][p["pid"]]
    if REAL:
        assert abs(procs[p["pid"]] - truth) <= REAL_BAND
    else:
        assert procs[p["pid"]] == truth
    assert p["nvml_total"] == (CAP if run.mode == "cap" else p["observed"]["device_total"])
    if run.mode != "bare":
        assert list(procs) == [p["pid"]], "NVML under cuquota lists the container's processes only"
    return p


def profiler(run):
    assert run.step("profiler")["ok"]


def sm_share(limited, base=None, lo=0.25, hi=0.35):
    """Simulator: the device time the loop got over its own window, from the timeline. Real GPU: its kernel
    rate against the no-cuquota baseline (the ratio band is wider: real kernels vary)."""
    if REAL:
        ratio = h.rate(limited) / h.rate(base)
        assert lo - 0.05 <= ratio <= hi + 0.05, f"kernel rate {ratio:.3f} of the unlimited baseline"
        return ratio
    s = h.share(limited)
    assert lo <= s <= hi, f"share {s:.3f} of device time (launches {limited['launches']})"
    return s
