"""What every framework worker shares: the line protocol with the test process and the step runner.

A worker runs the steps named on its command line (`name[:arg[:arg]]`) in order. Each step reports one JSON
object on stdout, prefixed with MARK so that library chatter on stdout cannot be mistaken for it. A
checkpoint reports, then waits for a line on stdin: the test process observes the GPU (the simulator's
ground truth, the container's usage region) while the worker holds its memory, then lets it go on.
"""
import json
import os
import sys
import time
import traceback

MARK = "@@cuquota-fw "


def emit(**fields):
    print(MARK + json.dumps(fields), flush=True)


def checkpoint(name, **fields):
    emit(checkpoint=name, pid=os.getpid(), **fields)
    if not sys.stdin.readline():
        sys.exit(3)  # the test process went away


def now_ns():
    """CLOCK_MONOTONIC in ns: the clock of the simulator's device timeline."""
    return time.monotonic_ns()


def run(steps, table):
    for spec in steps:
        name, *args = spec.split(":")
        if name not in table:
            emit(step=name, error=f"unknown step {name!r}; known: {sorted(table)}")
            sys.exit(2)
        try:
            table[name](*args)
        except SystemExit:
            raise
        except BaseException as e:  # report, then fail the worker
            emit(step=name, error=f"{type(e).__module__}.{type(e).__qualname__}: {e}"[:2000])
            traceback.print_exc()
            sys.exit(1)
    emit(done=True)


def nvml_view(index=0):
    """The process list and memory NVML reports to this process (under cuquota: the container's view)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return {
            "procs": [[p.pid, p.usedGpuMemory] for p in procs],
            "nvml_total": mem.total,
            "nvml_used": mem.used,
            "nvml_free": mem.free,
        }
    finally:
        pynvml.nvmlShutdown()
