"""pynvml (nvidia-ml-py 13.615.71) under cuquota: what an NVML-only process (a monitoring sidecar, a
dashboard) sees while a CUDA process of its container and one of another container use the GPU."""
import pytest

import harness as h
from harness import CAP, MiB, REAL

MODES = ("bare", "shim", "cap")


@pytest.fixture(scope="module", params=MODES)
def view(request, tmp_path_factory):
    h.require_module("pynvml")
    h.require_module("cuda.bindings")
    mode = request.param
    box = h.Box(tmp_path_factory.mktemp(f"pynvml-{mode}"))
    # A process of another container on the same GPU (its own usage file), holding 64 MiB.
    other = h.Worker(box, "cudapy_worker.py", ["hold:64"], "shim", {"CUQUOTA_USAGE_FILE": str(box.dir / "other")})
    try:
        while (ev := other.next_event()) is not None and "checkpoint" not in ev:
            pass
        assert ev is not None, f"the other container's process failed: {other.stderr()[-2000:]}"
        seen = {}

        def at_hold(run, ev):
            # the simulator shows its processes in the graphics and MPS lists too (CUDASIM_NVML_LISTS)
            seen["nvml"] = h.run_worker(
                box, "nvml_worker.py", ["info", "lists"], mode, {"CUDASIM_NVML_LISTS": "compute,graphics,mps"}
            )

        holder = h.run_worker(box, "cudapy_worker.py", ["hold:128"], mode, on_checkpoint=at_hold)
    finally:
        other.go()
        other.finish()
    return mode, holder, seen["nvml"], other.pid


def test_device_and_driver(view):
    mode, holder, nvml, _ = view
    info = nvml.step("info")
    assert info["count"] >= 1
    assert info["uuid"].startswith("GPU-")
    if not REAL:
        assert info["name"] == "NVIDIA H100 80GB HBM3 (cudasim)" and info["cuda_driver"] == 13000


def test_memory_is_the_containers_view(view):
    mode, holder, nvml, _ = view
    info = nvml.step("info")
    obs = holder.step("hold")["observed"]
    total = CAP if mode == "cap" else obs["device_total"]
    used = obs["region_used"] if mode == "cap" else obs["device_used"]
    assert info["total"] == info["v2_total"] == total
    if REAL and mode != "cap":
        assert abs(info["used"] - used) <= 1024 * MiB
    else:
        assert info["used"] == used and info["free"] == total - used
        assert info["v2_free"] == info["free"]


def test_process_list_holds_the_containers_processes_only(view):
    mode, holder, nvml, other = view
    procs = dict(nvml.step("info")["procs"])
    truth = holder.step("hold")["observed"]["procs"]
    assert holder.pid in procs, procs
    if REAL:
        assert abs(procs[holder.pid] - truth[holder.pid]) <= 1024 * MiB
    else:
        assert procs[holder.pid] == truth[holder.pid]
    if mode == "bare":
        assert other in procs, "without cuquota NVML lists every process on the GPU"
    else:
        assert sorted(procs) == [holder.pid], f"another container's process is visible: {procs}"


def test_every_process_list_holds_the_containers_processes_only(view):
    """Graphics and MPS lists and the detail list in every mode, through pynvml's own size-query-then-fetch."""
    mode, holder, nvml, other = view
    lists = nvml.step("lists")
    truth = holder.step("hold")["observed"]["procs"]
    if "error" in lists:
        pytest.fail(f"nvml_worker lists: {lists['error']}")
    for name in ("graphics", "mps", "detail_compute", "detail_graphics", "detail_mps"):
        procs = dict(lists[name])
        if not REAL:
            assert procs.get(holder.pid) == truth[holder.pid], (name, procs)
        if mode == "bare":
            assert REAL or other in procs, (name, procs)
        else:
            assert other not in procs, f"{name}: another container's process is visible: {procs}"
