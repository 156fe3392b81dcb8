"""Runs unmodified frameworks (pynvml, cuda-python, CuPy, PyTorch) under cuquota and observes them.

Every framework runs in a worker process (workers/*.py) with a clean environment: on the simulated GPU
(libcudasim.so answering as libcuda.so.1 / libnvidia-ml.so.1, a fresh state file per scenario) unless this
machine has an NVIDIA driver, where the real one is used. Modes:

- ``bare``: no cuquota (the baseline);
- ``shim``: LD_PRELOAD=libcuquota.so, no limits;
- ``cap``: with CUDA_DEVICE_MEMORY_LIMIT=1g;
- ``sm30``: with CUDA_DEVICE_SM_LIMIT=30 and GPU_CORE_UTILIZATION_POLICY=FORCE (a hard ceiling);
- ``elastic``: the agent's limits file (`Box.elastic`): a 1 GiB limit above a 64 MiB request, the evict ask
  set and cleared by `Box.evict` as the agent's reclaim does.

At each checkpoint of a worker the test process observes, from outside: the driver's ground truth through
NVML in a process that is not under cuquota (workers/observe.py), the container's usage region
(`cuquota status --json`), and on the simulator the device time a process got (its timeline).

Paths: $CUQUOTA_TEST_SHIM, else target/$CUQUOTA_TEST_PROFILE/libcuquota.so (profile default: debug, where
Cargo.toml builds the shim and the simulator with opt-level 3), and
the simulator and CLI from the same profile. $CUQUOTA_FW_DEVICE=sim|gpu overrides the detection.
"""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
SETUP = "scripts/setup.sh frameworks"
MARK = "@@cuquota-fw "

MiB = 1 << 20
GiB = 1 << 30

# The simulated GPU of every scenario: an H100 with 4 GiB (enough to run out of quickly), the simulator's
# default per-context and per-module overhead, 2 MiB allocation granularity.
SIM_MEMORY = 4 * GiB
SIM_CTX = 256 * MiB
SIM_MODULE = 2 * MiB
CAP = 1 * GiB
SM_LIMIT = 30


def _real_gpu():
    forced = os.environ.get("CUQUOTA_FW_DEVICE", "")
    if forced in ("sim", "gpu"):
        return forced == "gpu"
    if forced:
        raise SystemExit(f"CUQUOTA_FW_DEVICE={forced!r}: expected sim or gpu")
    if os.path.exists("/dev/nvidiactl"):
        return True
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libcuda.so.1" in out


REAL = _real_gpu()
DEVICE = "real GPU" if REAL else "simulated GPU (libcudasim.so)"

_target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
TARGET = _target if _target.is_absolute() else ROOT / _target
PROFILE = os.environ.get("CUQUOTA_TEST_PROFILE", "debug")  # the shim and simulator are optimised there too
SHIM = Path(os.environ.get("CUQUOTA_TEST_SHIM") or TARGET / PROFILE / "libcuquota.so").resolve()
SIM = TARGET / PROFILE / "libcudasim.so"
CLI = TARGET / PROFILE / "cuquota"
CACHE = TARGET / "frameworks-cache"  # CuPy's compiled kernels, kept between runs


def require_module(name):
    """Fails (never skips) the test when a framework is missing from the suite's environment."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.fail(f"{name} is not installed in {sys.prefix}: run {SETUP} (pinned wheels, once)", pytrace=False)


def require_builds():
    missing = [p for p in (SHIM, CLI) + (() if REAL else (SIM,)) if not p.exists()]
    if missing:
        pytest.fail(
            f"not built: {', '.join(map(str, missing))} — run tests/frameworks/run.sh "
            f"(or cargo build -p cuquota -p cuquota-sim -p cuquota-cli)",
            pytrace=False,
        )


class Box:
    """One scenario: its own simulated GPU (state file) and container (usage file)."""

    def __init__(self, path: Path):
        self.dir = path
        self.state = path / "sim.state"
        self.usage = path / "usage"
        self.limits = path / "limits"
        self.lib = path / "lib"
        self.logs = []
        if not REAL:
            self.lib.mkdir(exist_ok=True)
            for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"):
                link = self.lib / name
                if not link.exists():
                    link.symlink_to(SIM)

    def env(self, mode, extra=None):
        e = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER") if k in os.environ}
        e.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", CUPY_CACHE_DIR=str(CACHE / "cupy"))
        if REAL:
            if "LD_LIBRARY_PATH" in os.environ:
                e["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        else:
            e.update(
                LD_LIBRARY_PATH=str(self.lib),
                CUDASIM_STATE=str(self.state),
                CUDASIM_MEMORY=str(SIM_MEMORY),
                CUDASIM_CTX_OVERHEAD=str(SIM_CTX),
                CUDASIM_MODULE_OVERHEAD=str(SIM_MODULE),
            )
        if mode != "bare":
            e.update(LD_PRELOAD=str(SHIM), CUQUOTA_USAGE_FILE=str(self.usage))
        if mode == "cap":
            e["CUDA_DEVICE_MEMORY_LIMIT"] = "1g"
        elif mode == "sm30":
            e.update(CUDA_DEVICE_SM_LIMIT=str(SM_LIMIT), GPU_CORE_UTILIZATION_POLICY="FORCE")
        elif mode == "elastic":
            e["CUQUOTA_LIMITS_FILE"] = str(self.limits)
        elif mode not in ("bare", "shim"):
            raise ValueError(f"unknown mode {mode}")
        e.update(extra or {})
        return e

    def cli(self, *args):
        cmd = [str(CLI), *map(str, args)]
        r = subprocess.run(cmd, env=self.env("bare"), capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            pytest.fail(f"cuquota {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}", pytrace=False)
        return r.stdout

    def elastic(self, limit="1g", request="64m"):
        """The limits file of mode ``elastic``: every device limited to `limit` with `request` guaranteed."""
        self.cli("limits", "init", self.limits)
        self.cli("limits", "set", self.limits, "--device", "all", "--memory", limit, "--request", request)

    def evict(self, on):
        """Sets or clears the limits file's evict ask (what the agent writes when it reclaims)."""
        self.cli("limits", "set", self.limits, "--device", "all", "--evict", "on" if on else "off")

    def observe(self, busy=None):
        """Ground truth from NVML outside cuquota, the container's region, and (simulator) device time."""
        args = [sys.executable, str(WORKERS / "observe.py")]
        if busy and not REAL:
            args += ["BUSY", *map(str, busy)]
        r = subprocess.run(args, env=self.env("bare"), capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            pytest.fail(f"observer failed ({r.returncode}): {r.stderr[-2000:]}", pytrace=False)
        obs = json.loads(r.stdout.strip().splitlines()[-1])
        obs["procs"] = {int(k): v for k, v in obs["procs"].items()}
        if self.usage.exists():
            r = subprocess.run(
                [str(CLI), "status", "--usage", str(self.usage), "--interval", "0", "--json"],
                env=self.env("bare"),
                capture_output=True,
                text=True,
                timeout=60,
            )
            if r.returncode != 0:
                pytest.fail(f"cuquota status failed ({r.returncode}): {r.stderr}", pytrace=False)
            status = json.loads(r.stdout)
            dev = next((d for d in status["devices"] if d["entry"] == 0), None)
            obs["region_used"] = dev["memory_used_bytes"] if dev else 0
            obs["region_procs"] = {p["host_pid"]: p["memory_used_bytes"] for p in dev["processes"]} if dev else {}
        return obs


@dataclass
class Run:
    """What a worker reported: its steps by name (each with the observation taken at its checkpoint)."""

    worker: str
    mode: str
    steps: dict = field(default_factory=dict)
    returncode: int = None
    stderr: str = ""
    pid: int = None

    def step(self, name):
        if name not in self.steps:
            failed = [s for s in self.steps.values() if "error" in s]
            why = failed[0]["error"] if failed else f"exit status {self.returncode}"
            pytest.fail(
                f"{self.worker} ({self.mode}) did not complete step {name!r}: {why}\n--- stderr (tail)\n"
                f"{self.stderr[-3000:]}",
                pytrace=False,
            )
        s = self.steps[name]
        if "error" in s:
            pytest.fail(f"{self.worker} ({self.mode}) step {name!r} failed: {s['error']}\n{self.stderr[-3000:]}")
        return s


class Worker:
    """A live worker process; `events()` yields its reports, `go()` lets it pass a checkpoint."""

    def __init__(self, box, script, steps, mode, extra_env=None, timeout=600):
        self.box, self.mode, self.script = box, mode, script
        self.err_path = box.dir / f"{script}.{len(box.logs)}.{mode}.stderr"
        box.logs.append(self.err_path)
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / script), *steps],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=box.env(mode, extra_env),
            text=True,
            cwd=str(box.dir),
        )
        self.deadline = time.monotonic() + timeout
        # A thread reads stdout line by line (select() on a buffered pipe misses lines already buffered).
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    @property
    def pid(self):
        return self.proc.pid

    def next_event(self):
        """The next report, or None at the end of the worker's output."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                pytest.fail(f"{self.script} ({self.mode}) timed out; stderr: {self.stderr()[-2000:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                return None
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])

    def go(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        self.err.close()
        return rc

    def stderr(self):
        if not self.err.closed:
            self.err.flush()
        return self.err_path.read_text(errors="replace")


def run_worker(box, script, steps, mode, extra_env=None, on_checkpoint=None):
    """Runs a worker to its end. At each checkpoint the box is observed (with the device time of the
    timed loop just reported, if any) and `on_checkpoint(run, event)` may act before the worker goes on."""
    w = Worker(box, script, steps, mode, extra_env)
    run = Run(worker=script, mode=mode, pid=w.pid)
    try:
        while (ev := w.next_event()) is not None:
            if "checkpoint" in ev:
                step = run.steps.setdefault(ev["checkpoint"], {})
                busy = (ev["pid"], step["t0"], step["t1"]) if "t0" in step else None
                step["observed"] = box.observe(busy)
                if on_checkpoint:
                    on_checkpoint(run, ev)
                w.go()
            elif "step" in ev:
                run.steps[ev["step"]] = ev
    finally:
        run.returncode = w.finish()
        run.stderr = w.stderr()
    return run


def share(step):
    """The share of device time a timed loop got over its own window (simulator timeline)."""
    return step["observed"]["busy_ns"] / (step["t1"] - step["t0"])


def rate(step):
    return step["launches"] / ((step["t1"] - step["t0"]) / 1e9)


def used_view(mode, obs):
    """The memory in use as the framework's process should see it: the container's region under a cap,
    the whole device otherwise."""
    return obs["region_used"] if mode == "cap" else obs["device_used"]


def clean_cache():
    shutil.rmtree(CACHE, ignore_errors=True)
