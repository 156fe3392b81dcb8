#!/usr/bin/env bash
# The test command (CI runs it through .ci/run). Needs rustup's cargo, a C compiler (cc) and python3 with pip; no
# GPU. See docs/testing.md.
#
#   1. setup: every pinned dependency, installed once by scripts/setup.sh (a no-op when present); no test
#      installs or downloads anything;
#   2. lint gates: cargo fmt --check and cargo clippy -D warnings;
#   3. build, then every test of the workspace on the simulated GPU (tests that need root run when root);
#   4. the hot-path gate: instructions the shim adds per launch, alloc/free pair and cuMemGetInfo (callgrind over
#      a stub driver, release build) within the bounds in bench/tests/hot_path.rs;
#   5. the deployable library (glibc 2.17, built with zig) must build, load and enforce the same limits; the
#      release tarball (scripts/release.sh) must unpack, check and run.
set -euo pipefail
cd "$(dirname "$0")"
START=$SECONDS
step() { echo "== test.sh [$((SECONDS - START)) s]: $*"; }

step "setup (scripts/setup.sh)"
scripts/setup.sh

step "lint: cargo fmt --all --check"
cargo fmt --all --check
step "lint: cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --quiet --workspace --all-targets -- -D warnings

step "build"
cargo build --quiet --workspace

step "tests"
cargo test --workspace --no-fail-fast
if [ "$(id -u)" = 0 ]; then
    step "tests that need root"
    cargo test -p shim-tests --test privileges --test liveness -- --ignored
    # The agent's cgroup (v2 and, where mounted, v1 freezer) and pid-namespace membership.
    if [ -e /sys/fs/cgroup/freezer/tasks ]; then
        cargo test -p shim-tests --test agent_enforce -- --ignored --skip bench_
    else
        echo "test.sh: no cgroup v1 freezer at /sys/fs/cgroup/freezer: cgroup_v1_membership_kill_and_freezer_throttle stays ignored"
        cargo test -p shim-tests --test agent_enforce -- --ignored --skip cgroup_v1_ --skip bench_
    fi
    # Real containers (podman): the DRA plugin's CDI device (dra/tests/podman.rs) and HAMi's device-plugin
    # mounts and env with cuquota in libvgpu.so's place (hami_monitor.rs).
    if command -v podman >/dev/null && command -v runc >/dev/null; then
        cargo test -p cuquota-dra --test podman -- --ignored
        cargo test -p shim-tests --test hami_monitor -- --ignored
    else
        echo "test.sh: no podman/runc: dra/tests/podman.rs and hami_monitor.rs's container test stay ignored"
    fi
else
    echo "test.sh: not root: the tests that drop privileges, unshare pid namespaces or make cgroups stay ignored" \
        "(shim-tests/tests/privileges.rs, liveness.rs, agent_enforce.rs, hami_monitor.rs, dra/tests/podman.rs)"
fi

step "hot-path gate (bench/tests/hot_path.rs: callgrind instruction counts over the stub driver, bench/README.md)"
cargo test -p cuquota-bench --test hot_path -- --ignored --nocapture

step "portable build (scripts/build-portable.sh) and its tests"
./scripts/build-portable.sh
CUQUOTA_TEST_SHIM="$PWD/dist/libcuquota.so" cargo test -p shim-tests \
    --test memory_apis --test loading_styles --test multiprocess --test throttle
step "release tarball (tests/release.sh: scripts/release.sh --fast, checksums, binaries, library)"
tests/release.sh
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null && command -v runc >/dev/null; then
    step "the cuquota image (tests/image.sh: scripts/image.sh, then run with podman)"
    tests/image.sh
else
    echo "test.sh: not root or no podman/runc: tests/image.sh (the cuquota image) does not run"
fi

step "framework suite (tests/frameworks: PyTorch, CuPy, cuda-python, pynvml under cuquota)"
tests/frameworks/run.sh

step "all passed"
