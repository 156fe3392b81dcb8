"""vLLM-style use: several PyTorch processes of one container (a tensor-parallel pair, an engine and its
workers) share one memory cap; each sees the container's memory; one more process, started once the cap is
reached, fails cleanly without disturbing the others."""
import harness as h
from harness import CAP as SIM_CAP, GiB, MiB

# Two PyTorch contexts on a real GPU take about 1 GiB of the container's memory themselves (NVML's figure, which
# cuquota counts near the cap; the simulator's contexts take nothing of it), so there the cap is 4 GiB.
CAP = 4 * GiB if h.REAL else SIM_CAP
ENV = {"CUDA_DEVICE_MEMORY_LIMIT": str(CAP)}


def until_checkpoint(w):
    steps = {}
    while (ev := w.next_event()) is not None:
        if "checkpoint" in ev:
            return steps[ev["checkpoint"]]
        steps[ev["step"]] = ev
    raise AssertionError(f"{w.script} ended early: {steps} {w.stderr()[-3000:]}")


def test_processes_share_the_cap_and_one_more_fails_cleanly(box):
    h.require_module("torch")
    a = h.Worker(box, "torch_worker.py", ["hold:256", "meminfo", "meminfo"], "cap", ENV)
    b = None
    try:
        until_checkpoint(a)
        b = h.Worker(box, "torch_worker.py", ["hold:128", "oom:64", "meminfo"], "cap", ENV)
        b_hold = until_checkpoint(b)
        obs = box.observe()
        assert obs["region_procs"].keys() == {a.pid, b.pid}
        assert b_hold["total"] == CAP and b_hold["free"] == CAP - obs["region_used"]
        a.go()
        a_view = until_checkpoint(a)
        assert a_view["total"] == CAP and a_view["free"] == CAP - obs["region_used"], "A sees B's memory"

        # B fills the container's cap.
        b.go()
        b_oom = until_checkpoint(b)
        full = box.observe()
        assert b_oom["error_type"] == "torch.OutOfMemoryError"
        assert full["region_used"] <= CAP and CAP - full["region_used"] < 64 * MiB
        assert full["region_used"] == full["procs"][a.pid] + full["procs"][b.pid] or h.REAL

        # A third process cannot even create its context: a clean Python error, no hang, no crash.
        c = h.run_worker(box, "torch_worker.py", ["info"], "cap", ENV)
        assert c.returncode == 1, f"third process: exit {c.returncode}\n{c.stderr[-3000:]}"
        assert "info" in c.steps and "out of memory" in c.steps["info"]["error"], c.steps
        after = box.observe()
        assert after["region_used"] == full["region_used"] and c.pid not in after["region_procs"]

        # The pair goes on unharmed.
        a.go()
        a_again = until_checkpoint(a)
        assert a_again["free"] == CAP - after["region_used"]
        a.go()
        b.go()
        b_end = until_checkpoint(b)
        assert b_end["reserved"] >= 128 * MiB
        b.go()
        assert a.finish() == 0 and b.finish() == 0
    finally:
        for w in (a, b):
            if w is not None:
                w.kill()
