//! Integration-test harness for cuquota.
//!
//! - finds the workspace's build outputs (`libcuquota.so`, `libcudasim.so`, the `cuquota` CLI), which
//!   `./test.sh` builds before `cargo test`;
//! - compiles the C programs in `shim-tests/c/` against NVIDIA's headers in `.deps/` (once, cached under
//!   `target/shim-tests-c/`, rebuilt when a source is newer);
//! - [`Sim`] makes a fresh simulated GPU per test: a temp dir with the simulator state file, the container's
//!   usage file and a `lib/` dir of `libcuda.so.1` / `libnvidia-ml.so.1` symlinks to the simulator;
//! - [`Cmd`] runs a program there (with `LD_PRELOAD=libcuquota.so` unless told otherwise) under a timeout, and
//!   [`Output`] parses the `key=value` lines the programs print.
//!
//! The C programs are documented at the top of each file; `probe` interprets driver operations given on its
//! command line, `nvml_probe` does the same for NVML.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
pub mod compute_loop;
pub mod containers;
pub mod credit;
pub mod priority;
pub mod reclaim;

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// 1 KiB.
pub const KIB: u64 = 1 << 10;
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Default time a test program may run before it is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace root (the directory holding `DESIGN.md`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("shim-tests has a parent")
        .to_path_buf()
}

/// The cargo target dir: `$CARGO_TARGET_DIR`, else the one the running test binary lives in, else
/// `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        return if d.is_absolute() {
            d
        } else {
            workspace_root().join(d)
        };
    }
    // <target>/<profile>/deps/<test binary>
    if let Ok(exe) = std::env::current_exe() {
        if let Some(t) = exe.parent().and_then(Path::parent).and_then(Path::parent) {
            if t.join("CACHEDIR.TAG").exists() {
                return t.to_path_buf();
            }
        }
    }
    workspace_root().join("target")
}

/// The directory of the build profile the tests use (`target/debug`, or `$CUQUOTA_TEST_PROFILE`).
pub fn profile_dir() -> PathBuf {
    let profile = std::env::var("CUQUOTA_TEST_PROFILE").unwrap_or_else(|_| "debug".into());
    target_dir().join(profile)
}

fn built(name: &str, what: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} not found at {}: build the workspace first (run ./test.sh, or `cargo build --workspace`)",
        what,
        p.display()
    );
    p
}

/// `libcuquota.so`, the preload library under test: `$CUQUOTA_TEST_SHIM` when set (test.sh points it at the
/// portable build in dist/), else the profile's build.
pub fn shim_lib() -> PathBuf {
    match std::env::var_os("CUQUOTA_TEST_SHIM") {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(p.exists(), "CUQUOTA_TEST_SHIM={} does not exist", p.display());
            p
        }
        None => built("libcuquota.so", "libcuquota.so (the shim)"),
    }
}

/// `libcudasim.so`, the simulated driver.
pub fn sim_lib() -> PathBuf {
    built(
        "libcudasim.so",
        "libcudasim.so (the simulator, crate cuquota-sim)",
    )
}

/// The `cuquota` CLI binary.
pub fn cli_bin() -> PathBuf {
    built("cuquota", "the cuquota CLI (crate cuquota-cli)")
}

/// NVIDIA's headers (pinned wheels nvidia-cuda-runtime, nvidia-nvml-dev), installed by `scripts/setup.sh`.
pub fn include_dir() -> PathBuf {
    let p = workspace_root().join(".deps/cu13/nvidia/cu13/include");
    assert!(
        p.join("cuda.h").exists() && p.join("nvml.h").exists(),
        "NVIDIA headers not found in {}: run scripts/setup.sh (./test.sh runs it first)",
        p.display()
    );
    p
}

// ---------------------------------------------------------------------------------------------------------
// C programs
// ---------------------------------------------------------------------------------------------------------

/// The test programs, one per link variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prog {
    /// `probe.c` linked with `-ldl` only: reaches the driver with dlopen + dlsym or cuGetProcAddress, as the
    /// CUDA runtime does (style chosen with `--style`, default `dlsym`).
    Probe,
    /// `probe.c` linked with `-lcuda`: calls the versioned symbols directly.
    ProbeDirect,
    /// `probe.c` linked with `-lcuda` and built with `CUDA_API_PER_THREAD_DEFAULT_STREAM` (`_ptsz` symbols).
    ProbeDirectPtds,
    /// `nvml_probe.c` linked with `-lnvidia-ml`.
    NvmlProbe,
    /// `alloc_probe.c` linked with `-lcuda`: the README demo.
    AllocProbe,
    /// `sim_observer.c` linked with `-lcuda` (the simulator): reads the device timeline. Run it without preload.
    SimObserver,
    /// `priority_tenant.c` with `-ldl`: a high-priority tenant issuing bursts, or a best-effort one issuing long
    /// kernels (the priority tests and benchmark).
    PriorityTenant,
    /// `chaos.c` linked with `-lcuda`: the hardening workloads (kill chaos, thread storm, fork/exec) and the
    /// memory observer (run that one without preload).
    Chaos,
}

impl Prog {
    fn spec(self) -> (&'static str, &'static str, &'static [&'static str]) {
        // (output name, source, extra flags after the source)
        match self {
            Prog::Probe => ("probe_dl", "probe.c", &["-ldl", "-lpthread"]),
            Prog::ProbeDirect => (
                "probe_direct",
                "probe.c",
                &["-DCQ_DIRECT", "-lcuda", "-ldl", "-lpthread"],
            ),
            Prog::ProbeDirectPtds => (
                "probe_direct_ptds",
                "probe.c",
                &[
                    "-DCQ_DIRECT",
                    "-DCUDA_API_PER_THREAD_DEFAULT_STREAM",
                    "-lcuda",
                    "-ldl",
                    "-lpthread",
                ],
            ),
            Prog::NvmlProbe => ("nvml_probe", "nvml_probe.c", &["-lnvidia-ml"]),
            Prog::AllocProbe => ("alloc_probe", "alloc_probe.c", &["-lcuda"]),
            Prog::SimObserver => ("sim_observer", "sim_observer.c", &["-lcuda"]),
            Prog::PriorityTenant => ("priority_tenant", "priority_tenant.c", &["-ldl"]),
            Prog::Chaos => ("chaos", "chaos.c", &["-lcuda", "-ldl", "-lpthread"]),
        }
    }
}

fn c_dir() -> PathBuf {
    workspace_root().join("shim-tests/c")
}

fn newest_source_mtime() -> SystemTime {
    std::fs::read_dir(c_dir())
        .expect("shim-tests/c")
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn run_cc(args: &[&std::ffi::OsStr]) {
    let out = Command::new(cc())
        .args(args)
        .output()
        .expect("run the C compiler (cc)");
    assert!(
        out.status.success(),
        "C compile failed: {} {:?}\n{}",
        cc(),
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn up_to_date(out: &Path, newest: SystemTime) -> bool {
    out.metadata()
        .and_then(|m| m.modified())
        .map(|m| m >= newest)
        .unwrap_or(false)
}

/// Builds `out` with `build(tmp)` unless it is newer than every source; the temp-then-rename keeps
/// concurrent test binaries from seeing half-written files.
fn build_once(out: &Path, build: impl FnOnce(&Path)) {
    if up_to_date(out, newest_source_mtime()) {
        return;
    }
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = out.with_extension(format!(
        "tmp{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    build(&tmp);
    std::fs::rename(&tmp, out).expect("rename compiled program");
}

/// Directory of the link-time `libcuda.so` / `libnvidia-ml.so`, so that programs linked against them need the real
/// sonames: `libcuda.so` is the simulator itself (soname `libcuda.so.1`, exporting the whole driver API);
/// `libnvidia-ml.so` is a stub with soname `libnvidia-ml.so.1` (the simulator's soname is libcuda's).
fn link_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target_dir().join("shim-tests-c/link");
        std::fs::create_dir_all(&dir).expect("create link dir");
        // Replace atomically: test binaries running in parallel may do this at the same moment.
        let tmp = dir.join(format!("libcuda.so.tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(sim_lib(), &tmp).expect("symlink libcuda.so");
        std::fs::rename(&tmp, dir.join("libcuda.so")).expect("rename libcuda.so");
        let src = c_dir().join("nvml_stub.c");
        build_once(&dir.join("libnvidia-ml.so"), |tmp| {
            run_cc(&[
                "-shared".as_ref(),
                "-fPIC".as_ref(),
                "-Wl,-soname,libnvidia-ml.so.1".as_ref(),
                src.as_os_str(),
                "-o".as_ref(),
                tmp.as_os_str(),
            ])
        });
        dir
    })
    .clone()
}

/// Path of a compiled test program (compiled on first use in this test binary).
pub fn program(p: Prog) -> PathBuf {
    static BUILT: OnceLock<Mutex<BTreeMap<Prog, PathBuf>>> = OnceLock::new();
    let map = BUILT.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = map.get(&p) {
        return path.clone();
    }
    let (name, src, flags) = p.spec();
    let out = compile_c(name, &c_dir().join(src), &[], flags);
    map.insert(p, out.clone());
    out
}

/// `c/throttle_paths.c` as most throttle tests run it: CUDA reached through `dlopen`/`dlsym` (`-ldl`).
pub fn throttle_paths_dl() -> PathBuf {
    let src = workspace_root().join("shim-tests/c/throttle_paths.c");
    compile_c("throttle_paths_dl", &src, &[], &["-ldl"])
}

/// `c/throttle_paths.c` linked against `libcuda` directly (`-DTHR_DIRECT`), as the agent's and the CLI's tests
/// run it.
pub fn throttle_paths_direct() -> PathBuf {
    let src = workspace_root().join("shim-tests/c/throttle_paths.c");
    compile_c(
        "throttle_paths_direct",
        &src,
        &[],
        &["-DTHR_DIRECT", "-lcuda", "-ldl"],
    )
}

/// Compiles the C program `src` into `target/shim-tests-c/<name>` (unless up to date) with NVIDIA's headers
/// and `shim-tests/c` on the include path and the link stubs (`-lcuda`, `-lnvidia-ml`) on the library path;
/// `extra_sources` are also watched for changes. Returns the executable's path.
pub fn compile_c(name: &str, src: &Path, extra_sources: &[&Path], flags: &[&str]) -> PathBuf {
    let dir = target_dir().join("shim-tests-c");
    std::fs::create_dir_all(&dir).expect("create shim-tests-c dir");
    let out = dir.join(name);
    let inc = format!("-I{}", include_dir().display());
    let cdir = format!("-I{}", c_dir().display());
    let libdir = format!("-L{}", link_dir().display());
    let newest = extra_sources
        .iter()
        .chain(std::iter::once(&src))
        .filter_map(|p| p.metadata().ok()?.modified().ok())
        .chain(std::iter::once(newest_source_mtime()))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if up_to_date(&out, newest) {
        return out;
    }
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = out.with_extension(format!(
        "tmp{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-O2".as_ref(),
        "-g".as_ref(),
        "-Wall".as_ref(),
        inc.as_ref(),
        cdir.as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        tmp.as_os_str(),
        libdir.as_ref(),
    ];
    args.extend(flags.iter().map(|f| f.as_ref() as &std::ffi::OsStr));
    run_cc(&args);
    std::fs::rename(&tmp, &out).expect("rename compiled program");
    out
}

/// The allocation bench (`bench/alloc_bench.c`) and the stub driver it is measured over (`bench/stub_driver.c`, the
/// `libcuda.so.1` of a directory of its own), compiled: (the stub's directory, the bench). For `cuquota-bench` and
/// the hot-path gate.
pub fn alloc_bench_and_stub() -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(target_dir().join("shim-tests-c/stub")).expect("stub dir");
    let stub = compile_c(
        "stub/libcuda.so.1",
        &workspace_root().join("bench/stub_driver.c"),
        &[],
        &[
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libcuda.so.1",
        ],
    );
    let bench = compile_c(
        "alloc_bench",
        &workspace_root().join("bench/alloc_bench.c"),
        &[],
        &["-lcuda", "-lpthread"],
    );
    (stub.parent().expect("stub dir").to_path_buf(), bench)
}

// ---------------------------------------------------------------------------------------------------------
// The simulated GPU
// ---------------------------------------------------------------------------------------------------------

/// Builder of a [`Sim`]; every field maps to one `CUDASIM_*` variable (DESIGN.md, simulator env table).
#[derive(Clone, Debug)]
pub struct SimBuilder {
    devices: u32,
    memory: String,
    sms: Option<String>,
    ctx_overhead: String,
    module_overhead: Option<String>,
    uuids: Option<String>,
    extra: Vec<(String, String)>,
}

impl SimBuilder {
    /// Number of devices (`CUDASIM_DEVICES`).
    pub fn devices(mut self, n: u32) -> Self {
        self.devices = n;
        self
    }
    /// Memory per device, e.g. `"16g"` or `"8g,16g"` (`CUDASIM_MEMORY`).
    pub fn memory(mut self, m: &str) -> Self {
        self.memory = m.into();
        self
    }
    /// SM count (`CUDASIM_SMS`).
    pub fn sms(mut self, s: &str) -> Self {
        self.sms = Some(s.into());
        self
    }
    /// Memory charged per context (`CUDASIM_CTX_OVERHEAD`). The harness default is `0`, so tests that do not
    /// care about overhead see exact numbers; tests about overhead set it.
    pub fn ctx_overhead(mut self, o: &str) -> Self {
        self.ctx_overhead = o.into();
        self
    }
    /// Memory charged per module (`CUDASIM_MODULE_OVERHEAD`).
    pub fn module_overhead(mut self, o: &str) -> Self {
        self.module_overhead = Some(o.into());
        self
    }
    /// Comma list of `GPU-…` UUIDs (`CUDASIM_UUIDS`).
    pub fn uuids(mut self, u: &str) -> Self {
        self.uuids = Some(u.into());
        self
    }
    /// Any other simulator variable.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.extra.push((k.into(), v.into()));
        self
    }

    /// Creates the temp dir, the symlink dir and the env.
    pub fn build(self) -> Sim {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "cuquota-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            nanos % 1_000_000_000
        ));
        let lib = dir.join("lib");
        std::fs::create_dir_all(&lib).expect("create sim temp dir");
        let sim = sim_lib();
        for name in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            std::os::unix::fs::symlink(&sim, lib.join(name)).expect("symlink simulator");
        }
        let mut env = vec![
            (
                "CUDASIM_STATE".to_string(),
                dir.join("sim.state").display().to_string(),
            ),
            ("CUDASIM_DEVICES".to_string(), self.devices.to_string()),
            ("CUDASIM_MEMORY".to_string(), self.memory.clone()),
            ("CUDASIM_CTX_OVERHEAD".to_string(), self.ctx_overhead.clone()),
        ];
        if let Some(s) = &self.sms {
            env.push(("CUDASIM_SMS".into(), s.clone()));
        }
        if let Some(s) = &self.module_overhead {
            env.push(("CUDASIM_MODULE_OVERHEAD".into(), s.clone()));
        }
        if let Some(s) = &self.uuids {
            env.push(("CUDASIM_UUIDS".into(), s.clone()));
        }
        env.extend(self.extra);
        Sim { dir, lib, env }
    }
}

/// One simulated machine: a GPU state file shared by every process run through it, and (by default) one
/// container's usage file.
#[derive(Debug)]
pub struct Sim {
    dir: PathBuf,
    lib: PathBuf,
    env: Vec<(String, String)>,
}

impl Sim {
    /// A builder with 1 device of 16 GiB and no context overhead.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> SimBuilder {
        SimBuilder {
            devices: 1,
            memory: "16g".into(),
            sms: None,
            ctx_overhead: "0".into(),
            module_overhead: None,
            uuids: None,
            extra: Vec::new(),
        }
    }

    /// The test's temp dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory holding the `libcuda.so.1` / `libnvidia-ml.so.1` symlinks.
    pub fn lib_dir(&self) -> &Path {
        &self.lib
    }

    /// The default container's usage file (`CUQUOTA_USAGE_FILE`).
    pub fn usage_file(&self) -> PathBuf {
        self.container_usage_file("default")
    }

    /// The usage file of another container `name` on the same GPU.
    pub fn container_usage_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("usage.{name}"))
    }

    /// Where an agent-written limits file goes for this test (`CUQUOTA_LIMITS_FILE`, set on commands only
    /// when the file exists).
    pub fn limits_file(&self) -> PathBuf {
        self.dir.join("limits")
    }

    /// The node's priority directory: one file per container with a priority (docs/priority.md).
    pub fn priority_dir(&self) -> PathBuf {
        self.dir.join("priority.node")
    }

    /// Creates the node's priority directory, as the agent does; commands get their container's file through
    /// [`Cmd::priority`] (or [`Sim::container_priority_file`]).
    pub fn create_priority_dir(&self) -> PathBuf {
        let d = self.priority_dir();
        std::fs::create_dir_all(&d).expect("create the priority directory");
        d
    }

    /// What the agent does for container `name` with a priority (`high` or not): creates its file in the node
    /// directory (`NAME.high` / `NAME.low`; renamed when the priority changes, as the agent does live), and
    /// gives the container its own view, as the mounts would: the file read-write at `prio.NAME/priority` (a
    /// hard link: the same file) and the node directory beside it at `prio.NAME/priority.d` (the directory's
    /// read-only mount is not modelled: tests play the attacker themselves and write only the file a tenant
    /// could). Returns the container's own file (`CUQUOTA_PRIORITY_FILE`).
    pub fn container_priority_file(&self, name: &str, high: bool) -> PathBuf {
        let node = self.create_priority_dir();
        let (mine, other) = if high { ("high", "low") } else { ("low", "high") };
        let file = node.join(format!("{name}.{mine}"));
        let was = node.join(format!("{name}.{other}"));
        if was.exists() {
            std::fs::rename(&was, &file).expect("rename the container's priority file");
        }
        cuquota_core::region::PriorityRegion::create(&file).expect("create the container's priority file");
        let view = self.dir.join(format!("prio.{name}"));
        std::fs::create_dir_all(&view).expect("the container's view");
        let own = view.join("priority");
        if !own.exists() {
            std::fs::hard_link(&file, &own).expect("link the container's priority file");
            std::os::unix::fs::symlink(&node, view.join("priority.d")).expect("link the node directory");
        }
        own
    }

    /// The own priority file of best-effort container `name`, with the entry of the device container `like`
    /// claimed in its file (as `name`'s shim would claim it): what a lying tenant of `name` may write.
    pub fn liar_priority_file(&self, name: &str, like: &str) -> PathBuf {
        use cuquota_core::region::PriorityRegion;
        let f = self.container_priority_file(name, false);
        let other = PriorityRegion::open_file(&self.container_priority_file(like, false)).expect("open");
        let uuid = other.devices(mono_ns())[0].uuid;
        PriorityRegion::open_file(&f)
            .expect("open")
            .device(&uuid)
            .expect("claim");
        f
    }

    /// The agent writes the `all` entry of the limits file `file` (created if needed; e.g. one per container,
    /// given to a command with `.env("CUQUOTA_LIMITS_FILE", …)`) through `edit`.
    pub fn agent_limits(&self, file: &Path, edit: impl FnOnce(&mut cuquota_core::PolicyRaw)) {
        use cuquota_core::region::{DeviceSelector, LimitsWriter};
        let w = LimitsWriter::create(file).expect("create the limits file");
        w.update(|t| {
            edit(&mut t.entry_mut(DeviceSelector::All)?.raw);
            Ok::<_, cuquota_core::region::TableFull>(())
        })
        .expect("limits file busy")
        .expect("limits table full");
    }

    /// A command running `prog` on this GPU under libcuquota.so.
    pub fn cmd(&self, prog: Prog) -> Cmd<'_> {
        self.cmd_path(program(prog))
    }

    /// A command running an arbitrary executable on this GPU under libcuquota.so.
    pub fn cmd_path(&self, path: PathBuf) -> Cmd<'_> {
        Cmd {
            sim: self,
            path,
            args: Vec::new(),
            env: Vec::new(),
            remove: Vec::new(),
            preload: true,
            timeout: DEFAULT_TIMEOUT,
            usage: self.usage_file(),
            name: "default".into(),
            pre_exec_uid: None,
        }
    }

    /// The node agent sets the memory limit (`"768m"`, `"0"` = none) of CUDA ordinal `index` in this sim's
    /// limits file, creating the file if needed, with core's `LimitsWriter` (what `cuquota limits set` uses).
    pub fn agent_memory_limit(&self, index: u32, limit: &str) {
        use cuquota_core::region::{DeviceSelector, LimitsWriter};
        let bytes = cuquota_core::units::parse_size(limit).unwrap_or_else(|e| panic!("limit {limit}: {e:?}"));
        let w = LimitsWriter::create(&self.limits_file()).expect("create the limits file");
        w.update(|t| {
            t.entry_mut(DeviceSelector::Index(index))?.memory_limit = bytes;
            Ok::<_, cuquota_core::region::TableFull>(())
        })
        .expect("limits file busy")
        .expect("limits table full");
    }

    /// The node agent sets a hard SM limit of `pct` percent on every device in this sim's limits file (creating
    /// it if needed). Returns CLOCK_MONOTONIC ns right after the write committed: from then on the new limit is
    /// observable in the region, so a test of how fast it applies measures from here.
    pub fn agent_sm_limit_hard(&self, pct: u32) -> u64 {
        use cuquota_core::region::layout::POLICY_HARD;
        use cuquota_core::region::{DeviceSelector, LimitsWriter};
        let w = LimitsWriter::create(&self.limits_file()).expect("create the limits file");
        w.update(|t| {
            let e = t.entry_mut(DeviceSelector::All)?;
            e.sm_limit = pct;
            e.policy = POLICY_HARD;
            Ok::<_, cuquota_core::region::TableFull>(())
        })
        .expect("limits file busy")
        .expect("limits table full");
        mono_ns()
    }

    /// Same as [`Sim::agent_memory_limit`], through the node agent's tool:
    /// `cuquota limits set <file> --device <index> --memory <limit>`.
    pub fn cli_memory_limit(&self, index: u32, limit: &str) {
        let file = self.limits_file();
        let file = file.to_str().expect("utf-8 temp path");
        let idx = index.to_string();
        let out = self.cli(&["limits", "set", file, "--device", &idx, "--memory", limit]);
        assert!(out.success(), "cuquota limits set failed:{out:?}");
    }

    /// The node agent's tool writes limits file `file`: `cuquota limits init <file>`, then
    /// `cuquota limits set <file> --device all <args>`.
    pub fn cli_limits(&self, file: &Path, args: &[&str]) {
        let f = file.to_str().expect("utf-8 temp path");
        let o = self.cli(&["limits", "init", f]);
        assert!(o.success(), "{o:?}");
        let mut a = vec!["limits", "set", f, "--device", "all"];
        a.extend_from_slice(args);
        let o = self.cli(&a);
        assert!(o.success(), "{o:?}");
    }

    /// Device time (ns) that process `pid` (as NVML knows it; 0 = every process) occupied device `dev` during
    /// `[from, to)` of CLOCK_MONOTONIC: exact, from the simulator's kernel-interval ring (the ground truth the
    /// timing tests judge by, never the programs' own clocks). The ring holds the last 16384 intervals.
    pub fn busy_ns(&self, dev: u32, pid: u32, from: u64, to: u64) -> u64 {
        self.observe(dev, pid, from, to, None).0
    }

    /// `pid`'s busy ns on `dev` in consecutive `bin`-ns windows from `from` to `to`.
    pub fn busy_bins(&self, dev: u32, pid: u32, from: u64, to: u64, bin: u64) -> Vec<u64> {
        self.observe(dev, pid, from, to, Some(bin)).1
    }

    /// `pid`'s share of device `dev` during `[from, to)`, in percent.
    pub fn share_pct(&self, dev: u32, pid: u32, from: u64, to: u64) -> f64 {
        assert!(to > from, "empty window {from}..{to}");
        self.busy_ns(dev, pid, from, to) as f64 * 100.0 / (to - from) as f64
    }

    /// `shim-tests/c/NAME.c` (linked with `libs`) run with `args` under a hard `pct` % SM limit, one CPU-heavy
    /// place held: its output, and the share (percent) of device `dev` over its launch window that its main
    /// process got (`all`: every process on the device).
    pub fn hard_share(
        &self,
        pct: u32,
        name: &str,
        libs: &[&str],
        args: &str,
        dev: u32,
        all: bool,
    ) -> (f64, Output) {
        let prog = compile_c(
            name,
            &workspace_root().join(format!("shim-tests/c/{name}.c")),
            &[],
            libs,
        );
        let _h = heavy();
        let out = self
            .cmd_path(prog)
            .timeout(Duration::from_secs(120))
            .env("CUDA_DEVICE_SM_LIMIT", &pct.to_string())
            .env("CUQUOTA_POLICY", "hard")
            .args(args)
            .run();
        assert!(out.success(), "{out:?}");
        let w = out.window();
        let s = self.share_pct(dev, if all { 0 } else { w.pid }, w.t0, w.end);
        println!("{name} {args}: {pct} % tenant got {s:.1} % of device {dev}");
        (s, out)
    }

    fn observe(&self, dev: u32, pid: u32, from: u64, to: u64, bin: Option<u64>) -> (u64, Vec<u64>) {
        let mut c = self
            .cmd(Prog::SimObserver)
            .no_preload()
            .arg(&dev.to_string())
            .arg(&pid.to_string())
            .arg(&from.to_string())
            .arg(&to.to_string());
        if let Some(b) = bin {
            c = c.arg(&b.to_string());
        }
        let out = c.run();
        assert!(out.success(), "the timeline observer failed:{out:?}");
        let bins = match bin {
            Some(_) => out
                .val("bins")
                .split(',')
                .map(|v| v.parse().expect("bin"))
                .collect(),
            None => Vec::new(),
        };
        (out.num("busy"), bins)
    }

    /// Runs the `cuquota` CLI with `args` (env: this sim's usage and limits files).
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut c = self.cmd_path(cli_bin()).no_preload();
        c.args = args.iter().map(|s| s.to_string()).collect();
        c.run()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if std::env::var_os("CUQUOTA_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Running programs
// ---------------------------------------------------------------------------------------------------------

/// Writes `words(now)` (hp_last_launch, hp_busy_until) into every device entry of `file` every `every`,
/// until dropped: what a tenant with write access to that file can do without running any GPU work.
#[derive(Debug)]
pub struct PriorityLiar {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    t: Option<std::thread::JoinHandle<u64>>,
}

impl PriorityLiar {
    /// Starts the liar on `file`, writing every `every`.
    pub fn start(file: &Path, every: Duration, words: fn(u64) -> (u64, u64)) -> PriorityLiar {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .expect("the liar opens the file it may write");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            let mut writes = 0u64;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let (last, busy) = words(mono_ns());
                for i in 0..cuquota_core::region::layout::MAX_DEVICES {
                    let base = std::mem::offset_of!(cuquota_core::region::layout::PriorityFile, devices)
                        + i * std::mem::size_of::<cuquota_core::region::layout::PriorityDevice>();
                    let at = |off: usize| (base + off) as u64;
                    std::os::unix::fs::FileExt::write_all_at(
                        &f,
                        &last.to_ne_bytes(),
                        at(std::mem::offset_of!(
                            cuquota_core::region::layout::PriorityDevice,
                            hp_last_launch
                        )),
                    )
                    .unwrap();
                    std::os::unix::fs::FileExt::write_all_at(
                        &f,
                        &busy.to_ne_bytes(),
                        at(std::mem::offset_of!(
                            cuquota_core::region::layout::PriorityDevice,
                            hp_busy_until
                        )),
                    )
                    .unwrap();
                }
                writes += 1;
                std::thread::sleep(every);
            }
            writes
        });
        PriorityLiar { stop, t: Some(t) }
    }

    /// Lie 1 of issue 23: the high-priority state erased.
    pub fn erase(_now: u64) -> (u64, u64) {
        (0, 0)
    }

    /// Lie 2 of issue 23: a busy high-priority queue, republished (every 0.5 s in the tests).
    pub fn forge(now: u64) -> (u64, u64) {
        (now, now + 500_000_000)
    }

    /// Stops it; the number of rounds it wrote.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.t.take().unwrap().join().unwrap()
    }
}

/// A program to run on a [`Sim`].
#[derive(Debug)]
pub struct Cmd<'a> {
    sim: &'a Sim,
    path: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    remove: Vec<String>,
    preload: bool,
    timeout: Duration,
    usage: PathBuf,
    /// The container's name ([`Cmd::container`]).
    name: String,
    pre_exec_uid: Option<u32>,
}

impl Cmd<'_> {
    /// Appends arguments, split on whitespace (`"init alloc:mem:1g"`).
    pub fn args(mut self, line: &str) -> Self {
        self.args.extend(line.split_whitespace().map(String::from));
        self
    }
    /// Appends one argument verbatim.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }
    /// `probe --style S`.
    pub fn style(mut self, s: &str) -> Self {
        self.args.insert(0, s.into());
        self.args.insert(0, "--style".into());
        self
    }
    /// Sets an env variable (the memory limit, …).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// `CUDA_DEVICE_MEMORY_LIMIT=v`.
    pub fn mem_limit(self, v: &str) -> Self {
        self.env("CUDA_DEVICE_MEMORY_LIMIT", v)
    }
    /// HAMi's `CUDA_TASK_PRIORITY=p` (`0` high, `1` low), with the container's priority file (the agent made
    /// it `.high` for `0`): call after [`Cmd::container`].
    pub fn priority(self, p: &str) -> Self {
        let f = self.sim.container_priority_file(&self.name, p == "0");
        self.env("CUDA_TASK_PRIORITY", p)
            .env("CUQUOTA_PRIORITY_FILE", f.to_str().expect("utf-8 temp path"))
    }
    /// Removes a variable the harness would set (e.g. `CUQUOTA_USAGE_FILE`).
    pub fn env_remove(mut self, k: &str) -> Self {
        self.remove.push(k.into());
        self
    }
    /// Runs without LD_PRELOAD (the simulator alone).
    pub fn no_preload(mut self) -> Self {
        self.preload = false;
        self
    }
    /// Kill the program after `t`.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Runs as a process of container `name` (its own usage file) on the same GPU.
    pub fn container(mut self, name: &str) -> Self {
        self.usage = self.sim.container_usage_file(name);
        self.name = name.into();
        self
    }
    /// Drop privileges to `uid` (and gid) before exec. Only possible when the tests run as root.
    pub fn as_uid(mut self, uid: u32) -> Self {
        self.pre_exec_uid = Some(uid);
        self
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        c.args(&self.args);
        c.env_clear();
        for k in ["PATH", "HOME", "TMPDIR", "LANG"] {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        let mut env: BTreeMap<String, String> = self.sim.env.iter().cloned().collect();
        env.insert("LD_LIBRARY_PATH".into(), self.sim.lib.display().to_string());
        env.insert(
            "CQ_SIM_LIB".into(),
            self.sim.lib.join("libnvidia-ml.so.1").display().to_string(),
        );
        env.insert("CUQUOTA_USAGE_FILE".into(), self.usage.display().to_string());
        // HAMi's file per container in the test's directory (else every test would share /tmp/cudevshr.cache).
        env.insert(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            format!("{}.hami.cache", self.usage.display()),
        );
        let limits = self.sim.limits_file();
        if limits.exists() {
            env.insert("CUQUOTA_LIMITS_FILE".into(), limits.display().to_string());
        }
        if self.preload {
            env.insert("LD_PRELOAD".into(), shim_lib().display().to_string());
        }
        for (k, v) in &self.env {
            env.insert(k.clone(), v.clone());
        }
        for k in &self.remove {
            env.remove(k);
        }
        c.envs(env);
        // Its own process group, so that a timeout also ends whatever it forked (and nothing else).
        {
            use std::os::unix::process::CommandExt;
            c.process_group(0);
        }
        if let Some(uid) = self.pre_exec_uid {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid) between fork and exec.
            unsafe {
                c.pre_exec(move || {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(uid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "{}{} {} {}",
            env.join(" "),
            if self.preload {
                " LD_PRELOAD=libcuquota.so"
            } else {
                ""
            },
            self.path
                .file_name()
                .map(|s| s.to_string_lossy())
                .unwrap_or_default(),
            self.args.join(" ")
        )
    }

    /// Runs to completion (or the timeout) and collects the output.
    pub fn run(self) -> Output {
        self.spawn().finish()
    }

    /// Starts the program with a piped stdin, for programs that `wait`.
    pub fn spawn(self) -> Proc {
        let mut c = self.command();
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.path.display()));
        let stdin = child.stdin.take();
        let lines = Arc::new((Mutex::new(Lines::default()), Condvar::new()));
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let l2 = lines.clone();
        let out_thread = std::thread::spawn(move || {
            let mut r = BufReader::new(&mut stdout);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let (m, cv) = &*l2;
                        m.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .lines
                            .push(line.trim_end().to_string());
                        cv.notify_all();
                    }
                }
            }
            let (m, cv) = &*l2;
            m.lock().unwrap_or_else(|e| e.into_inner()).eof = true;
            cv.notify_all();
        });
        let (err_tx, err_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            let _ = err_tx.send(String::from_utf8_lossy(&s).into_owned());
        });
        Proc {
            describe: self.describe(),
            child,
            stdin,
            lines,
            out_thread: Some(out_thread),
            stderr: err_rx,
            deadline: Instant::now() + self.timeout,
        }
    }
}

#[derive(Debug, Default)]
struct Lines {
    lines: Vec<String>,
    eof: bool,
}

/// `[members]` of an agent descriptor whose `subtree` root is process `pid`: its pid and start time
/// (`/proc/<pid>/stat` field 22), as a descriptor's writer records them (docs/agent.md). Call it while the root
/// is alive and unreaped, so the pid cannot have been reused.
pub fn subtree_members(pid: u32) -> String {
    let st = cuquota_core::region::liveness::read_stat(pid).expect("the subtree root's /proc/<pid>/stat");
    format!("subtree = {pid}\nsubtree_start = {}", st.start_time)
}

/// A running program.
#[derive(Debug)]
pub struct Proc {
    describe: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<(Mutex<Lines>, Condvar)>,
    out_thread: Option<std::thread::JoinHandle<()>>,
    stderr: std::sync::mpsc::Receiver<String>,
    deadline: Instant,
}

/// How long output may still arrive after the program exited (from processes it left behind) before the
/// harness ends its process group.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `[members]` of an agent descriptor whose `subtree` root is this process (see [`subtree_members`]).
    pub fn subtree(&self) -> String {
        subtree_members(self.pid())
    }

    /// Waits until the program printed `key=…` (at least `n` times) and returns the last such value; panics
    /// on timeout or if the program ends first (with everything it printed).
    pub fn wait_for_nth(&mut self, key: &str, n: usize) -> String {
        let prefix = format!("{key}=");
        let (m, cv) = &*self.lines;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let found: Vec<&String> = g.lines.iter().filter(|l| l.starts_with(&prefix)).collect();
            if found.len() >= n {
                return found[n - 1][prefix.len()..].to_string();
            }
            let now = Instant::now();
            if g.eof || now >= self.deadline {
                let printed = g.lines.join("\n");
                drop(g);
                let _ = self.child.kill();
                panic!(
                    "{}: waiting for `{key}` (#{n}): {}\nstdout so far:\n{printed}",
                    self.describe,
                    if now >= self.deadline {
                        "timed out"
                    } else {
                        "program ended"
                    }
                );
            }
            g = cv
                .wait_timeout(g, self.deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Whether the program has exited (without waiting; reaps it if so).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the first `key=…` line.
    pub fn wait_for(&mut self, key: &str) -> String {
        self.wait_for_nth(key, 1)
    }

    /// Waits until the program reached `wait` (n-th time) and printed `ready=1`.
    pub fn wait_ready(&mut self, n: usize) {
        self.wait_for_nth("ready", n);
    }

    /// Writes `line` and a newline to the program's stdin (programs that read commands).
    pub fn send(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    /// Lets a program blocked in `wait` go on.
    pub fn release(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(b"\n");
            let _ = s.flush();
        }
    }

    /// SIGKILLs every process left in the program's process group (the program and what it forked).
    fn kill_group(&self) {
        // SAFETY: a negative pid names the process group the harness created for this child (`process_group(0)`
        // makes its pgid the child's pid); nothing outside it is signalled.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
    }

    /// True once the program's stdout reached end of file, waiting up to `t`.
    fn stdout_closed_within(&self, t: Duration) -> bool {
        let (m, cv) = &*self.lines;
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        cv.wait_timeout_while(g, t, |l| !l.eof)
            .unwrap_or_else(|e| e.into_inner())
            .0
            .eof
    }

    /// SIGKILLs the program (by its pid) and reaps it.
    pub fn kill(mut self) -> Output {
        let _ = self.child.kill();
        self.finish()
    }

    /// Closes stdin (so any `wait` returns), waits for the end (killing it at the deadline) and collects.
    pub fn finish(mut self) -> Output {
        self.stdin.take();
        let mut timed_out = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= self.deadline => {
                    timed_out = true;
                    self.kill_group();
                    break self.child.wait().expect("wait child");
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => panic!("wait: {e}"),
            }
        };
        // A process the program left behind may hold its stdout/stderr open: end the group after a grace, and
        // never wait for it for ever.
        if !self.stdout_closed_within(OUTPUT_GRACE) {
            self.kill_group();
        }
        if self.stdout_closed_within(OUTPUT_GRACE) {
            if let Some(t) = self.out_thread.take() {
                let _ = t.join();
            }
        }
        let stderr = self.stderr.recv_timeout(OUTPUT_GRACE).unwrap_or_default();
        let lines = std::mem::take(&mut self.lines.0.lock().unwrap_or_else(|e| e.into_inner()).lines);
        Output::new(self.describe.clone(), status, timed_out, lines, stderr)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// What a program did: its exit, stdout as `key=value` pairs (in order), and stderr.
pub struct Output {
    /// The command, for messages.
    pub describe: String,
    /// Exit status.
    pub status: ExitStatus,
    /// Killed by the harness at its deadline.
    pub timed_out: bool,
    /// Raw stdout lines.
    pub lines: Vec<String>,
    /// Raw stderr.
    pub stderr: String,
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\n--- {} ---\nstatus: {:?}{}\nstdout:\n{}\nstderr:\n{}\n---",
            self.describe,
            self.status,
            if self.timed_out {
                " (TIMED OUT, killed)"
            } else {
                ""
            },
            self.lines.join("\n"),
            self.stderr
        )
    }
}

impl Output {
    fn new(
        describe: String,
        status: ExitStatus,
        timed_out: bool,
        lines: Vec<String>,
        stderr: String,
    ) -> Self {
        Output {
            describe,
            status,
            timed_out,
            lines,
            stderr,
        }
    }

    /// The last value printed for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        let prefix = format!("{key}=");
        self.lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
    }

    /// Every value printed for `key`, in order.
    pub fn all(&self, key: &str) -> Vec<&str> {
        let prefix = format!("{key}=");
        self.lines
            .iter()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .collect()
    }

    /// Asserts that every `used=<bytes>` line (the simulator's own used bytes, printed by the attack programs)
    /// is at most `cap`, and that there is at least one.
    #[track_caller]
    pub fn assert_used_within(&self, cap: u64) {
        let used = self.all("used");
        assert!(!used.is_empty(), "no used= line:{self:?}");
        for u in used {
            let u: u64 = u.parse().expect("used=<bytes>");
            assert!(
                u <= cap,
                "the simulated GPU holds {} MiB under a {} MiB cap:\n{self:?}",
                u / MIB,
                cap / MIB
            );
        }
    }

    /// The largest number printed for `key` (e.g. the simulator's `used` bytes); panics if there is none.
    #[track_caller]
    pub fn peak(&self, key: &str) -> u64 {
        self.all(key)
            .iter()
            .map(|v| v.parse::<u64>().expect("a number"))
            .max()
            .unwrap_or_else(|| panic!("no `{key}=` line:{self:?}"))
    }

    /// The `n`-th (from 0) value printed for `key`, as a number; panics if absent.
    pub fn nth_num(&self, key: &str, n: usize) -> u64 {
        let all = self.all(key);
        let v = all
            .get(n)
            .unwrap_or_else(|| panic!("key `{key}` #{n} missing from the output:{self:?}"));
        v.parse()
            .unwrap_or_else(|_| panic!("key `{key}` #{n}: `{v}` is not a number:{self:?}"))
    }

    /// The last value printed for `key`; panics (showing the whole output) if absent.
    pub fn val(&self, key: &str) -> &str {
        match self.get(key) {
            Some(v) => v,
            None => panic!("key `{key}` missing from the output:{self:?}"),
        }
    }

    /// `val(key)` as a number.
    pub fn num(&self, key: &str) -> u64 {
        let v = self.val(key);
        v.parse()
            .unwrap_or_else(|_| panic!("key `{key}`: `{v}` is not a number:{self:?}"))
    }

    /// Asserts `key` printed `expected`.
    #[track_caller]
    pub fn expect(&self, key: &str, expected: &str) -> &Self {
        assert_eq!(self.val(key), expected, "`{key}`:{self:?}");
        self
    }

    /// Asserts a clean exit that reached the end of its command list.
    #[track_caller]
    pub fn ok(&self) -> &Self {
        assert!(
            self.status.success() && !self.timed_out,
            "program failed:{self:?}"
        );
        assert_eq!(
            self.get("done"),
            Some("1"),
            "program did not finish its commands:{self:?}"
        );
        self
    }

    /// Whether the process ended normally with status 0.
    pub fn success(&self) -> bool {
        self.status.success() && !self.timed_out
    }
}

/// Parses the `pid:bytes,pid:bytes` lists nvml_probe prints.
pub fn parse_proc_list(s: &str) -> Vec<(u32, u64)> {
    s.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (p, b) = e
                .split_once(':')
                .unwrap_or_else(|| panic!("bad process entry `{e}`"));
            (p.parse().expect("pid"), b.parse().expect("bytes"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------------------

/// CLOCK_MONOTONIC now, in ns: the clock of the simulator's device timeline.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How many CPU-heavy simulated processes may run at once: half the machine's cores, at least one.
pub fn heavy_slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// A place among the [`heavy_slots`]; released on drop.
#[derive(Debug)]
pub struct HeavyGuard(());

impl Drop for HeavyGuard {
    fn drop(&mut self) {
        let (m, cv) = heavy_state();
        *m.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        cv.notify_one();
    }
}

fn heavy_state() -> &'static (Mutex<usize>, Condvar) {
    static S: OnceLock<(Mutex<usize>, Condvar)> = OnceLock::new();
    S.get_or_init(|| (Mutex::new(0), Condvar::new()))
}

/// Waits for a place to run one CPU-heavy simulated process (a program that launches short kernels flat out,
/// whose share of the device depends on getting a CPU): tests that time such programs hold one guard per
/// process, so that no more run at once than half the cores (test binaries run one after another). Programs
/// whose kernels are long (≥ 1 ms: few launches, mostly asleep) need no guard.
pub fn heavy() -> HeavyGuard {
    let (m, cv) = heavy_state();
    let mut n = m.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= heavy_slots() {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
    *n += 1;
    HeavyGuard(())
}

/// The launch window a timing program printed (`pid`, `t0_ns`, `end_ns`: it launched from t0 until end).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// The program's pid (the simulator's NVML reports this pid when no namespace offset is set).
    pub pid: u32,
    /// CLOCK_MONOTONIC ns when it started launching.
    pub t0: u64,
    /// CLOCK_MONOTONIC ns when it stopped launching.
    pub end: u64,
}

impl Output {
    /// The launch window the program printed.
    pub fn window(&self) -> Window {
        Window {
            pid: self.num("pid") as u32,
            t0: self.num("t0_ns"),
            end: self.num("end_ns"),
        }
    }
}

/// Whether the tests run as root (needed to drop to an unprivileged uid).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The unprivileged uid the privilege tests drop to.
pub const NOBODY: u32 = 65534;

/// The MIG instance UUID the simulator gives the GPU with UUID `gpu` (`GPU-…`): its rule is byte 0 ^ 0x5a and
/// byte 15 ^ 0xa5 (shim-tests/sim/src/config.rs, `mig_uuid`).
pub fn mig_uuid_of(gpu: &str) -> String {
    let hex: String = gpu
        .trim_start_matches("GPU-")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    assert_eq!(hex.len(), 32, "bad uuid {gpu}");
    let mut b: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    b[0] ^= 0x5a;
    b[15] ^= 0xa5;
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "MIG-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Convenience: 1 process `probe` with `line`, run to the end under `limit`.
pub fn probe(sim: &Sim, limit: &str, line: &str) -> Output {
    sim.cmd(Prog::Probe).mem_limit(limit).args(line).run()
}

// ---------------------------------------------------------------------------------------------------------
// JSON output against the documented schemas
// ---------------------------------------------------------------------------------------------------------

/// Parses `json` (one `--json` report) and validates it against `docs/schemas/<schema_file>`; panics naming
/// every violation. Returns the parsed value for further checks.
#[track_caller]
pub fn check_schema(schema_file: &str, json: &str) -> serde_json::Value {
    let path = workspace_root().join("docs/schemas").join(schema_file);
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let validator = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{} is not a valid JSON Schema: {e}", path.display()));
    let value: serde_json::Value =
        serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("output is not JSON ({e}): {json}"));
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "output does not match {schema_file}:\n  {}\n{json}",
        errors.join("\n  ")
    );
    value
}
