"""The checks every framework's memory scenario must pass (used by test_torch / test_cupy / test_cuda_python).

A memory scenario is one worker running `info`, `oom:<chunk MiB>`, `free`, `copy`, `procs`, `profiler` in
one mode (bare, shim, cap); its `Run` carries, for each checkpoint, what the observer saw at that moment.
On the simulator the expected numbers are exact; on a real GPU, where the driver's and NVML's accounting of
its own reservations differ, the no-cuquota comparisons get a 1 GiB band (the cap's are still exact: cuquota
computes them).
"""
import time

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


# --- elastic memory (issue 39, docs/elastic-memory.md) ---------------------------------------------------
# Six 16 MiB tensors and an input buffer (each >= 2 MiB: movable), three training steps, idle, three more.
ELASTIC_STEPS = ["tensors:6:16", "train:3", "idle", "train:3", "result"]
EVICT_WAIT_S = 30  # the mover looks every 20 ms and copies at ~GB/s: this long only on a CPU-starved machine
PINNED_WAIT_S = 2  # what stays resident is given this long to (wrongly) move


def elastic_run(box, script, env=None, evict=True, movable=True):
    """The elastic scenario in mode ``elastic``. With `evict`, at the idle checkpoint the test asks for the
    eviction (the limits file's bit, as the agent), waits until NVML outside cuquota shows the worker's resident
    bytes down by all the framework reserved (`movable`), or PINNED_WAIT_S when nothing may move, observes, then
    clears the ask and lets the worker go on: its next copy or launch restores the memory."""
    box.elastic()

    def at(run, ev):
        if ev["checkpoint"] != "idle" or not evict:
            return
        idle = run.steps["idle"]
        before = idle["observed"]["procs"][run.pid]
        want = idle["reserved"] if not REAL else idle["reserved"] - REAL_BAND
        box.evict(True)
        t0 = time.monotonic()
        while True:
            obs = box.observe()
            moved, waited = before - obs["procs"].get(run.pid, 0), time.monotonic() - t0
            if (movable and moved >= want) or waited > (EVICT_WAIT_S if movable else PINNED_WAIT_S):
                break
            time.sleep(0.02)
        idle["evicted"] = {"observed": obs, "moved": moved, "seconds": waited}
        box.evict(False)

    return h.run_worker(box, script, ELASTIC_STEPS, "elastic", env, on_checkpoint=at)


def evicted_and_restored(base, run, movable, what):
    """`run` (evicted at its idle checkpoint) against `base` (the same steps, never asked): every byte equal
    before and after, what moved (all the framework reserved, or nothing when it is pinned resident), the
    charge and the program's free memory unchanged, all resident again after the next steps."""
    idle, res, bidle, bres = run.step("idle"), run.step("result"), base.step("idle"), base.step("result")
    assert idle["sums"] == bidle["sums"], "the two runs differ before any eviction"
    assert res["sums"] == bres["sums"], f"bytes changed by the eviction and restore: {res['sums']} vs {bres['sums']}"
    ev, before = idle["evicted"], idle["observed"]["procs"][run.pid]
    print(
        f"{what}: {ev['moved'] / MiB:.0f} MiB of {idle['reserved'] / MiB:.0f} MiB reserved moved to host memory "
        f"in {ev['seconds']:.2f} s (resident {before / MiB:.0f} MiB before)"
    )
    if not movable:
        assert ev["moved"] == 0, f"{ev['moved']} B of memory that must stay resident moved"
    elif REAL:
        assert ev["moved"] >= idle["reserved"] - REAL_BAND
    else:
        assert ev["moved"] == idle["reserved"], f"moved {ev['moved']} B of {idle['reserved']} B reserved"
    # Evicted memory stays charged: the container's region, and what the program is told is free.
    assert ev["observed"]["region_used"] == idle["observed"]["region_used"]
    assert res["total"] == CAP and res["free"] == idle["free"], "the program's free memory changed"
    # Restored by the next steps: resident as before, as the never-evicted run is.
    after, bafter = res["observed"]["procs"][run.pid], bres["observed"]["procs"][base.pid]
    assert bafter == bidle["observed"]["procs"][base.pid], "the control run's residency changed"
    if REAL:
        assert abs(after - before) <= REAL_BAND
    else:
        assert after == before, f"resident {after} B after the steps, {before} B before the eviction"
