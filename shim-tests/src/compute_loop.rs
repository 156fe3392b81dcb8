//! `examples/compute_loop.cu`, the H200 run's program, as the time-slicing tests run it: built once with the
//! pinned CUDA 13 toolchain, its `metric` lines read, and the common window of programs that ran at once.

use std::path::PathBuf;
use std::process::Command;

use crate::{target_dir, workspace_root, Output};

/// Warm-up left out of every window: the throttle settles on the kernel's duration.
pub const WARMUP_NS: u64 = 500_000_000;

/// Builds `examples/compute_loop.cu` with the pinned CUDA 13 toolchain (scripts/setup.sh installs it).
pub fn program() -> PathBuf {
    let out = target_dir().join("examples/cu13");
    let st = Command::new(workspace_root().join("examples/build.sh"))
        .args(["--cuda", "13", "--out"])
        .arg(&out)
        .arg("compute_loop")
        .status()
        .expect("run examples/build.sh");
    assert!(
        st.success(),
        "examples/build.sh failed: the pinned CUDA toolchain is installed by scripts/setup.sh"
    );
    out.join("compute_loop")
}

/// A `metric KEY=VALUE` line of compute_loop's output.
pub fn metric(o: &Output, k: &str) -> u64 {
    let p = format!("metric {k}=");
    o.lines
        .iter()
        .find_map(|l| l.strip_prefix(&p)?.parse().ok())
        .unwrap_or_else(|| panic!("metric {k}: {o:?}"))
}

/// The common window of programs that ran at once, after the warm-up: (from, to) in CLOCK_MONOTONIC ns. Each must
/// have succeeded, and the window must last at least 4 s.
pub fn window(outs: &[Output]) -> (u64, u64) {
    for o in outs {
        assert!(o.success(), "compute_loop failed:{o:?}");
    }
    let from = outs
        .iter()
        .map(|o| metric(o, "t0_mono_ns"))
        .max()
        .expect("programs")
        + WARMUP_NS;
    let to = outs
        .iter()
        .map(|o| metric(o, "t1_mono_ns"))
        .min()
        .expect("programs");
    assert!(
        to >= from + 4_000_000_000,
        "common window {} ms: the programs did not overlap for 4 s after warm-up",
        (to.saturating_sub(from)) / 1_000_000
    );
    (from, to)
}
