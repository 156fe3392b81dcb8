//! Real CUDA runtime programs on the simulator: the samples in `examples/` are built by nvcc (pinned PyPI wheels,
//! installed by the setup step `scripts/setup.sh`), statically linked with the CUDA runtime, and run through
//! `validate.sh`, without and with libcuquota.so, under memory caps and SM limits. The test passes when every row
//! of the validation table is OK; the table is printed either way. On the simulator the SM rows read the share
//! from the device timeline (validate.sh's `rate_of`).

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use shim_tests::{heavy, profile_dir, shim_lib, sim_lib, target_dir, workspace_root};

/// The validation runs time kernels on the simulated timeline: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn validate(args: &[&str]) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _h = heavy();
    let root = workspace_root();
    let check = Command::new(root.join("scripts/setup.sh"))
        .args(["--check", "cu13", "cu12"])
        .output()
        .expect("run scripts/setup.sh --check");
    assert!(
        check.status.success(),
        "the pinned CUDA toolchains are not installed: run scripts/setup.sh (./test.sh runs it first)\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let out = Command::new(root.join("validate.sh"))
        .args(args)
        .args(["--no-cargo", "--shim"])
        .arg(shim_lib())
        .arg("--sim")
        .arg(sim_lib())
        .env("CARGO_TARGET_DIR", target_dir())
        .output()
        .expect("run validate.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "validate.sh {args:?} reported failures (profile dir {}):\n{stdout}\n{stderr}",
        profile_dir().display()
    );
    assert!(stdout.contains(" OK, 0 FAIL"), "no summary line:\n{stdout}");
}

/// CUDA 13.0: every sample, without cuquota and with it under 1 GiB / 4 GiB caps and 30 % / 100 % SM limits.
#[test]
fn cuda13_samples_validation_table() {
    validate(&["--cuda", "13", "--seconds", "1.5"]);
}

/// CUDA 12.9 runtime: the functional samples, once without and once with cuquota.
#[test]
fn cuda12_samples_quick() {
    validate(&["--cuda", "12", "--quick"]);
}

/// Every sample in examples/ is described in docs/examples.md.
#[test]
fn samples_are_all_listed_in_docs() {
    let root = workspace_root();
    let docs = std::fs::read_to_string(root.join("docs/examples.md")).expect("docs/examples.md");
    for entry in std::fs::read_dir(root.join("examples")).expect("examples/") {
        let p = entry.expect("dir entry").path();
        let is_sample = matches!(p.extension().and_then(|e| e.to_str()), Some("cu" | "c"));
        if is_sample {
            let stem = p
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            assert!(
                docs.contains(&format!("`{stem}")),
                "{} is not described in docs/examples.md",
                Path::new(&p).display()
            );
        }
    }
}
