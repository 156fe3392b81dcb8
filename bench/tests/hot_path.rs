//! The hot-path gate: instructions libcuquota.so adds per call, counted by callgrind over the stub driver
//! (`bench/stub_driver.c`), must stay within the bounds of [`PATHS`] (bench/README.md, "Hot-path gate").
//!
//! Method (the one bench/README.md has used by hand): `alloc_bench MODE 1 N` under `valgrind --tool=callgrind`,
//! with and without `LD_PRELOAD=libcuquota.so`; added instructions per operation =
//! ((Ir at N = 12 000 − Ir at N = 2 000) with the shim − the same without) / 10 000, so start-up and exit cancel
//! out. The library is a release build of the `cuquota` crate with `codegen-units = 1` in its own target dir
//! (`target/hot-path`; the default 16 units move code between units when any module changes, which alone moved
//! untouched paths by ~20 instructions). The machine's load barely moves the counts (bench/README.md gives the
//! spread of seven runs: the SM-limited launch, whose throttle reads the clock, moves most, by about 1 %).
//!
//! `hot_path_instruction_counts` is `#[ignore]`d in a plain `cargo test` (it builds that library and runs
//! valgrind 16 times); test.sh runs it as a step of its own, after the workspace build (the C programs link
//! against the debug libcudasim.so, as every shim test's do):
//! `cargo test -p cuquota-bench --test hot_path -- --ignored`.

use shim_tests::{alloc_bench_and_stub, target_dir, workspace_root};
use std::path::PathBuf;
use std::process::Command;

/// One gated path: what alloc_bench runs, under which limits, today's figure and the bound.
struct HotPath {
    /// The row's name in bench/README.md's gate table.
    name: &'static str,
    /// `alloc_bench`'s mode: `launch` (cuLaunchKernel), `pair` (cuMemAlloc_v2 + cuMemFree_v2), `info`.
    mode: &'static str,
    /// The limits (environment) the shim runs under.
    limits: &'static [(&'static str, &'static str)],
    /// Instructions added per operation when the bound was set (bench/README.md says when and where).
    today: u32,
    /// The gate: more added instructions than this fails. A little above `today` (about +5 %, +4 for tiny
    /// figures), so only a real change of the path crosses it.
    bound: u32,
}

const CAP: (&str, &str) = ("CUDA_DEVICE_MEMORY_LIMIT", "64g");

/// The bounds. Edit a path's line here and its row in bench/README.md (`readme_states_the_bounds` checks both
/// agree) when a change of that path is measured and accepted.
#[rustfmt::skip]
const PATHS: &[HotPath] = &[
    HotPath { name: "cuLaunchKernel, no limit", mode: "launch", limits: &[], today: 20, bound: 24 },
    HotPath { name: "cuLaunchKernel, memory cap 64g", mode: "launch", limits: &[CAP], today: 313, bound: 329 },
    HotPath { name: "cuLaunchKernel, SM limit 50 %", mode: "launch", limits: &[("CUDA_DEVICE_SM_LIMIT", "50")], today: 1320, bound: 1386 },
    HotPath { name: "cuMemAlloc_v2 + cuMemFree_v2 pair, memory cap 64g", mode: "pair", limits: &[CAP], today: 551, bound: 567 },
    HotPath { name: "cuMemGetInfo_v2, memory cap 64g", mode: "info", limits: &[CAP], today: 207, bound: 217 },
];

/// Operations of the short and the long run: their difference is what is counted.
const SHORT: u64 = 2_000;
const LONG: u64 = 12_000;

/// Each path's measured figure against its bound: `Err` lists every path above its bound, with both figures.
fn check(measured: &[(&HotPath, f64)]) -> Result<(), String> {
    let over: Vec<String> = measured
        .iter()
        .filter(|(p, added)| *added > f64::from(p.bound))
        .map(|(p, added)| {
            format!(
                "{}: +{added:.1} instructions per call, bound +{} (+{} when set)",
                p.name, p.bound, p.today
            )
        })
        .collect();
    if over.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the shim's hot path grew past its bound (bench/README.md, \"Hot-path gate\"):\n  {}",
            over.join("\n  ")
        ))
    }
}

fn path(name: &str) -> &'static HotPath {
    PATHS.iter().find(|p| p.name == name).expect("a gated path")
}

#[test]
fn check_fails_a_path_above_its_bound() {
    let (launch, pair) = (
        path("cuLaunchKernel, no limit"),
        path("cuMemAlloc_v2 + cuMemFree_v2 pair, memory cap 64g"),
    );
    // At the bound: passes.
    assert_eq!(
        check(&[(launch, launch.bound.into()), (pair, pair.bound.into())]),
        Ok(())
    );
    // A tenth of an instruction above: fails, naming the path and both figures, and only that path.
    let err = check(&[(launch, f64::from(launch.bound) + 0.1), (pair, pair.today.into())])
        .expect_err("a count above its bound must fail the gate");
    let line = format!(
        "cuLaunchKernel, no limit: +{}.1 instructions per call, bound +{}",
        launch.bound, launch.bound
    );
    assert!(err.contains(&line), "{err}");
    assert!(!err.contains("pair"), "{err}");
}

#[test]
fn bounds_sit_a_little_above_today() {
    for p in PATHS {
        let slack = (p.today * 5).div_ceil(100).max(4);
        assert!(
            p.bound >= p.today && p.bound <= p.today + slack,
            "{}: bound +{} is not within +5 % (or +4) of today's +{}",
            p.name,
            p.bound,
            p.today
        );
    }
}

#[test]
fn readme_states_the_bounds() {
    let readme = std::fs::read_to_string(workspace_root().join("bench/README.md")).expect("bench/README.md");
    for p in PATHS {
        let row = format!("| {} | +{} | +{} |", p.name, p.today, p.bound);
        assert!(
            readme.contains(&row),
            "bench/README.md's gate table lacks the row `{row}` (bench/tests/hot_path.rs's PATHS)"
        );
    }
}

/// valgrind, or a failure naming what to install (never a silent skip).
fn valgrind() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("valgrind"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the hot-path gate needs valgrind (callgrind) on PATH: install it \
             (Debian/Ubuntu: `apt-get install valgrind`; as root `scripts/setup.sh valgrind` does)"
        )
    })
}

/// The release libcuquota.so with `codegen-units = 1`, built in `target/hot-path` (its own target dir, so this
/// cargo does not wait for the one running the test).
fn release_shim() -> PathBuf {
    let dir = target_dir().join("hot-path");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!(
        "hot-path gate: cargo build --release -p cuquota (codegen-units = 1) in {} (about 2 min the first time)",
        dir.display()
    );
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["build", "--release", "--quiet", "--offline", "-p", "cuquota"])
        .args(["--config", "profile.release.package.cuquota.codegen-units=1"])
        .arg("--target-dir")
        .arg(&dir)
        .status()
        .expect("run cargo");
    assert!(
        status.success(),
        "building the release libcuquota.so failed ({status})"
    );
    dir.join("release/libcuquota.so")
}

struct Rig {
    valgrind: PathBuf,
    bench: PathBuf,
    stub_dir: PathBuf,
    shim: PathBuf,
    tmp: PathBuf,
}

impl Rig {
    /// Instructions (callgrind's Ir, every thread) of one `alloc_bench MODE 1 N` run.
    fn ir(&self, mode: &str, n: u64, shim: Option<&[(&str, &str)]>) -> u64 {
        let mut c = Command::new(&self.valgrind);
        c.env_clear();
        for k in ["PATH", "HOME", "TMPDIR", "LANG"] {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        let stub = self.stub_dir.join("libcuda.so.1");
        // Each run its own usage and HAMi files, so that no run starts with another's slots to clean up.
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = self.tmp.join(format!(
            "{mode}.{n}.{}",
            RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&run).expect("run dir");
        c.env("LD_LIBRARY_PATH", &self.stub_dir)
            // The stub alone: no simulator, no NVML (the shim estimates what it cannot measure).
            .env("CUQUOTA_LIBCUDA", &stub)
            .env("CUQUOTA_LIBNVML", self.stub_dir.join("no-libnvidia-ml.so.1"))
            .env("CUQUOTA_USAGE_FILE", run.join("usage"))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", run.join("hami.cache"));
        if let Some(limits) = shim {
            c.env("LD_PRELOAD", &self.shim).envs(limits.iter().copied());
        }
        let out_file = run.join("callgrind.out");
        let out = c
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(&self.bench)
            .args([mode, "1", &n.to_string()])
            .output()
            .expect("run valgrind");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("failed=0"),
            "alloc_bench {mode} 1 {n} under callgrind (shim: {shim:?}) failed: {}\n{stderr}",
            out.status
        );
        // "==PID== Collected : 123456"
        stderr
            .lines()
            .find_map(|l| l.split_once("Collected :").map(|(_, n)| n.trim().parse().ok()))
            .flatten()
            .unwrap_or_else(|| panic!("no instruction count in callgrind's output:\n{stderr}"))
    }

    /// Instructions per operation: the difference between the long and the short run over `LONG - SHORT`.
    /// (alloc_bench also warms up with N / 10 + 10 operations, so 11 000 more run; every figure in
    /// bench/README.md since the first is divided by 10 000, and these stay comparable with them.)
    fn per_op(&self, mode: &str, shim: Option<&[(&str, &str)]>) -> f64 {
        let d = self.ir(mode, LONG, shim) as f64 - self.ir(mode, SHORT, shim) as f64;
        d / (LONG - SHORT) as f64
    }
}

#[test]
#[ignore = "builds a release libcuquota.so and runs valgrind: test.sh's hot-path step runs it (-- --ignored)"]
fn hot_path_instruction_counts() {
    let valgrind = valgrind();
    let shim = release_shim();
    let (stub_dir, bench) = alloc_bench_and_stub();
    let tmp = std::env::temp_dir().join(format!("cuquota-hot-path-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let rig = Rig {
        valgrind,
        bench,
        stub_dir,
        shim,
        tmp,
    };
    let mut measured = Vec::new();
    println!(
        "hot-path gate: callgrind over the stub driver, {} (codegen-units = 1)",
        rig.shim.display()
    );
    println!(
        "{:<52} {:>8} {:>8} {:>8} {:>8}",
        "path", "driver", "added", "today", "bound"
    );
    let mut base = std::collections::BTreeMap::new();
    for p in PATHS {
        let driver = *base.entry(p.mode).or_insert_with(|| rig.per_op(p.mode, None));
        let added = rig.per_op(p.mode, Some(p.limits)) - driver;
        println!(
            "{:<52} {:>8.1} {:>+8.1} {:>+8} {:>+8}",
            p.name, driver, added, p.today, p.bound
        );
        measured.push((p, added));
    }
    let _ = std::fs::remove_dir_all(&rig.tmp);
    if let Err(e) = check(&measured) {
        panic!("{e}");
    }
}
