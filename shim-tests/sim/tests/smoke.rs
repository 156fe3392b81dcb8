//! Builds `tests/c/*.c` against NVIDIA's real headers and runs them on the simulator, loaded the way programs
//! load a driver: through `libcuda.so.1` and `libnvidia-ml.so.1` symlinks to `libcudasim.so`.
//!
//! Headers: `$CUQUOTA_CUDA_INCLUDE`, else `<workspace>/.deps/cu13/nvidia/cu13/include` (where
//! `scripts/setup.sh` installs the pinned wheels). A missing header directory fails the test with the command that provides it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn include_dir() -> PathBuf {
    let dir = std::env::var_os("CUQUOTA_CUDA_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".deps/cu13/nvidia/cu13/include"));
    assert!(
        dir.join("cuda.h").exists() && dir.join("nvml.h").exists(),
        "NVIDIA headers not found in {}: run scripts/setup.sh in the workspace (./test.sh does), or set \
         CUQUOTA_CUDA_INCLUDE",
        dir.display()
    );
    dir
}

/// The cdylib cargo built for this test run (target/<profile>/libcudasim.so, next to deps/).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let lib = profile_dir.join("libcudasim.so");
    assert!(
        lib.exists(),
        "{} not built (cargo build -p cuquota-sim)",
        lib.display()
    );
    lib
}

/// A scratch directory with the driver symlinks, the compiled program and a state file.
struct Setup {
    dir: PathBuf,
    exe: PathBuf,
}

fn setup(name: &str, tag: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("cudasim-{name}-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = library();
    for link in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(link)).unwrap();
    }
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-std=c11")
        .arg("-D_GNU_SOURCE")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-Wno-deprecated-declarations")
        .arg("-I")
        .arg(include_dir())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(&dir)
        .arg("-l:libcuda.so.1")
        .arg("-l:libnvidia-ml.so.1")
        .arg("-ldl")
        .arg("-lpthread")
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Setup { dir, exe }
}

fn run(s: &Setup, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(&s.exe);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &s.dir)
        .env("CUDASIM_STATE", s.dir.join("state"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDASIM_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{}",
        s.exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const CONFIG: &[(&str, &str)] = &[
    ("CUDASIM_DEVICES", "2"),
    ("CUDASIM_MEMORY", "1g,2g"),
    ("CUDASIM_SMS", "4"),
    ("CUDASIM_CTX_OVERHEAD", "64m"),
];

#[test]
fn c_program_runs_on_the_simulator() {
    let s = setup("smoke", "run");
    assert_eq!(run(&s, &["all"], CONFIG).trim(), "OK");
    // A second process on the same state file: the first process's memory went back with it.
    assert_eq!(run(&s, &["all"], CONFIG).trim(), "OK");
    let mut env = CONFIG.to_vec();
    env.push(("CUDA_VISIBLE_DEVICES", "1"));
    assert_eq!(run(&s, &["visible"], &env).trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The time-slicing model at the API (`c/timeslice.c`): a kernel switched out for another process's slice ends
/// later for its events and its synchronisation, the other process does not wait for it, and the timeline
/// counts each its own time; the serialised model (the default) as the control.
#[test]
fn time_slicing_switches_a_running_kernel_out_for_another_process() {
    let s = setup("timeslice", "run");
    let sliced: &[(&str, &str)] = &[
        ("CUDASIM_SMS", "4"),
        ("CUDASIM_SCHED", "slice"),
        ("CUDASIM_QUANTUM_US", "2000"),
        ("CUDASIM_SWITCH_US", "200"),
    ];
    let out = run(&s, &["slice"], sliced);
    assert!(out.trim_end().ends_with("OK"), "{out}");
    let _ = std::fs::remove_file(s.dir.join("state"));
    let out = run(&s, &["serial"], &[("CUDASIM_SMS", "4")]);
    assert!(out.trim_end().ends_with("OK"), "{out}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn ipc_memory_between_two_processes() {
    let s = setup("ipc", "run");
    assert_eq!(run(&s, &[], CONFIG).trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn shareable_vmm_handles_between_two_processes() {
    let s = setup("vmm_share", "run");
    assert_eq!(run(&s, &[], CONFIG).trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn graph_memory_nodes_and_pool() {
    let s = setup("graph_mem", "run");
    assert_eq!(run(&s, &[], CONFIG).trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn documented_driver_and_nvml_behaviour() {
    let s = setup("fidelity", "run");
    assert_eq!(run(&s, &[], CONFIG).trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn bad_configuration_fails_cuinit_naming_the_variable() {
    let s = setup("smoke", "badcfg");
    for (var, value) in [("CUDASIM_MEMORY", "lots"), ("CUDASIM_HOST_PID_OFFSET", "-5")] {
        let out = Command::new(&s.exe)
            .arg("all")
            .env("LD_LIBRARY_PATH", &s.dir)
            .env("CUDASIM_STATE", s.dir.join("state"))
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(var));
    }
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[test]
fn many_processes_and_threads_share_one_state_file() {
    let s = setup("stress", "herd");
    let state = s.dir.join("state");
    // 24 processes start at once on a fresh state file, each with a different SM count in its environment:
    // exactly one configuration must win, and every process must see it.
    let handles: Vec<_> = (0..24)
        .map(|i| {
            let exe = s.exe.clone();
            let dir = s.dir.clone();
            let state = state.clone();
            std::thread::spawn(move || {
                Command::new(exe)
                    .arg("stress")
                    .env("LD_LIBRARY_PATH", &dir)
                    .env("CUDASIM_STATE", &state)
                    .env("CUDASIM_MEMORY", "512m")
                    .env("CUDASIM_CTX_OVERHEAD", "4m")
                    .env("CUDASIM_SMS", (10 + i).to_string())
                    .env_remove("CUDA_VISIBLE_DEVICES")
                    .output()
                    .expect("spawn")
            })
        })
        .collect();
    let mut sms = Vec::new();
    let mut ooms = 0;
    for h in handles {
        let out = h.join().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f: Vec<&str> = text.split_whitespace().collect();
        sms.push(f[1].parse::<u32>().unwrap());
        ooms += f[3].parse::<u32>().unwrap();
    }
    assert!(
        sms.iter().all(|&x| x == sms[0]),
        "configurations disagree: {sms:?}"
    );
    assert!(ooms > 0, "512 MiB shared by 24 processes must run out sometimes");
    assert_eq!(
        run(
            &s,
            &["check"],
            &[("CUDASIM_MEMORY", "512m"), ("CUDASIM_CTX_OVERHEAD", "4m")]
        )
        .trim(),
        "OK"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Every row of the cuGetProcAddress table names a symbol whose cuda.h prototype has exactly the type of the
/// `PFN_<name>_v<version>[_ptsz|_ptds]` typedef of cudaTypedefs.h for that (name, version, variant): the
/// version thresholds and per-thread variants are then NVIDIA's, checked by the C compiler.
#[test]
fn proc_table_rows_match_cudatypedefs_pfn_types() {
    let table =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proc_table.rs")).unwrap();
    let typedefs = std::fs::read_to_string(include_dir().join("cudaTypedefs.h")).unwrap();
    let profiler = std::fs::read_to_string(include_dir().join("cudaProfilerTypedefs.h")).unwrap();
    let mut c = String::from("#include <cuda.h>\n#include <cudaTypedefs.h>\n");
    let (mut rows, mut profiler_rows) = (0, 0);
    for line in table.lines() {
        let Some(row) = line.trim().strip_prefix('(').and_then(|l| l.strip_suffix("),")) else {
            continue;
        };
        let f: Vec<&str> = row.split(", ").collect();
        let [name, ver, variant, sym] = f[..] else {
            panic!("row {line}")
        };
        // cuda.h 12.0 renamed cuGraphInstantiate to cuGraphInstantiateWithFlags: no PFN_ of that version.
        if name == "cuGraphInstantiate" && sym == "cuGraphInstantiateWithFlags" {
            continue;
        }
        // cudaProfiler.h (the prototypes) is not in the runtime wheel, so cudaProfilerTypedefs.h does not
        // compile: its rows are checked by name against the typedefs' text.
        if name.starts_with("cuProfiler") {
            let typedef = format!("PFN_{name}_v{ver})");
            assert!(profiler.contains(&typedef) && sym == name, "{line}: no {typedef}");
            profiler_rows += 1;
            continue;
        }
        let pfn = ["", "_ptsz", "_ptds"]
            .iter()
            .filter(|s| (variant == "PerThread") != s.is_empty())
            .map(|s| format!("PFN_{name}_v{ver}{s}"))
            .find(|p| typedefs.contains(&format!("{p})")))
            .unwrap_or_else(|| panic!("no PFN typedef for {line}"));
        c.push_str(&format!(
            "_Static_assert(__builtin_types_compatible_p({pfn}, __typeof__(&{sym})), \"{pfn} -> {sym}\");\n"
        ));
        rows += 1;
    }
    assert!(rows > 600);
    assert_eq!(
        profiler_rows, 3,
        "cuProfilerInitialize, cuProfilerStart, cuProfilerStop"
    );
    let dir = std::env::temp_dir().join(format!("cudasim-pfn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("pfn.c");
    std::fs::write(&src, c).unwrap();
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11",
            "-fsyntax-only",
            "-Wno-deprecated-declarations",
            "-D__CUDA_API_VERSION_INTERNAL",
        ])
        .arg("-I")
        .arg(include_dir())
        .arg(&src)
        .output()
        .expect("run the C compiler");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "proc table vs cudaTypedefs.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pids` in a child pid namespace with its own /proc (`unshare`, as a container): (stdout up to ready=1, the
/// pids NVML listed, the process, still running until its stdin closes).
fn pids_in_namespace(s: &Setup, socket: Option<&Path>) -> (String, Vec<u32>, std::process::Child) {
    use std::io::BufRead;
    let mut cmd = Command::new("unshare");
    // A user namespace too, so that it runs without root where unprivileged ones are allowed.
    cmd.args(["--user", "--map-root-user", "--pid", "--fork", "--mount-proc"])
        .arg(&s.exe)
        .env("LD_LIBRARY_PATH", &s.dir)
        .env("CUDASIM_STATE", s.dir.join("state"))
        .env("CUDASIM_CTX_OVERHEAD", "0")
        .env_remove("CUDASIM_PID_SOCKET")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    if let Some(socket) = socket {
        cmd.env("CUDASIM_PID_SOCKET", socket);
    }
    let mut child = cmd.spawn().expect("run unshare");
    let mut out = String::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        out.push_str(&line);
        out.push('\n');
        if line == "ready=1" {
            break;
        }
    }
    let procs = out
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .unwrap_or_else(|| panic!("no procs= in:\n{out}"))
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().unwrap())
        .collect();
    (out, procs, child)
}

/// Ends a `pids` process (closes its stdin) and waits for it.
fn finish(mut child: std::process::Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

#[test]
fn nvml_reports_the_host_pid_of_a_process_in_a_pid_namespace() {
    let s = setup("pids", "run");
    let socket = s.dir.join("pid.sock");
    let mut server = Command::new(env!("CARGO_BIN_EXE_cudasim-pidd"))
        .arg(&socket)
        .spawn()
        .expect("run cudasim-pidd");
    while !socket.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // With the pid service: the pid the host knows (its /proc/PID/status names pid 1 of the namespace).
    let (out, procs, child) = pids_in_namespace(&s, Some(&socket));
    assert!(out.contains("alloc=0"), "{out}");
    assert_eq!(procs.len(), 1, "{out}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", procs[0])).unwrap_or_default();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap_or("");
    assert_eq!(
        nspid.split_whitespace().collect::<Vec<_>>(),
        ["NSpid:", &procs[0].to_string(), "1"],
        "NVML listed {} for the namespace's pid 1:\n{out}",
        procs[0]
    );
    finish(child);

    // Without: the namespace's own pid, as no driver reports it (documented in the README).
    let (out, procs, child) = pids_in_namespace(&s, None);
    assert_eq!(procs, [1], "{out}");
    finish(child);

    // Configured but not served: the first accounted call fails, naming the variable.
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_file(&socket);
    let mut cmd = Command::new(&s.exe);
    cmd.env("LD_LIBRARY_PATH", &s.dir)
        .env("CUDASIM_STATE", s.dir.join("state"))
        .env("CUDASIM_PID_SOCKET", &socket)
        .stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("ctx=304"), "{stdout}{stderr}");
    assert!(stderr.contains("CUDASIM_PID_SOCKET"), "{stderr}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Kernels that touch memory (`c/elastic.c touch`): writes seen through copies in stream order, at the kernel's
/// time on the timeline; reading an address unmapped before that time, never made accessible, written while
/// read-only, or mapped by nothing fails the context with CUDA_ERROR_ILLEGAL_ADDRESS (sticky: synchronisation,
/// allocation, launch and copy all return it), drops the work queued behind it, and leaves another context
/// working; unmapping after the synchronisation (the control) is fine.
#[test]
fn kernels_touch_memory_and_an_illegal_address_is_sticky_for_the_context() {
    let s = setup("elastic", "touch");
    let out = run(&s, &["touch"], &[("CUDASIM_SMS", "4")]);
    assert_eq!(out.trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Host VMM allocations and same-address remapping (`c/elastic.c host`): device memory evicted to a host
/// allocation and restored at the same address, kernels and copies seeing each backing; host allocations
/// count toward neither cuMemGetInfo nor NVML's usedGpuMemory.
#[test]
fn host_vmm_memory_is_not_device_memory_and_remaps_at_the_same_address() {
    let s = setup("elastic", "host");
    let out = run(&s, &["host"], &[("CUDASIM_SMS", "4")]);
    assert_eq!(out.trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// VMM access is per device (`c/elastic.c peer`): a kernel on device 1 touching device 0's range granted to
/// device 0 only fails with CUDA_ERROR_ILLEGAL_ADDRESS though peer access is enabled (it does not cover VMM
/// memory), on a device and on a host backing; granted to device 1 too (the control), it works.
#[test]
fn vmm_access_is_per_device_and_peer_access_does_not_grant_it() {
    let s = setup("elastic", "peer");
    let out = run(&s, &["peer"], &[("CUDASIM_SMS", "4"), ("CUDASIM_DEVICES", "2")]);
    assert_eq!(out.trim(), "OK");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The figures `c/elastic.c engines` prints: ends of an H2D copy, a D2H copy, a second H2D copy and a 100 ms
/// kernel, ms after a common start event.
fn engine_figures(s: &Setup, env: &[(&str, &str)]) -> [f64; 4] {
    let _ = std::fs::remove_file(s.dir.join("state"));
    let out = run(s, &["engines"], env);
    let mut lines = out.lines();
    let v: Vec<f64> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|x| x.parse().expect("a figure"))
        .collect();
    assert_eq!(lines.next(), Some("OK"), "{out}");
    v.try_into().expect("four figures")
}

/// A copy engine per direction (`CUDASIM_H2D_GBPS`, `CUDASIM_D2H_GBPS`): a 1 MiB copy each way (41.9 ms at
/// 0.025 GB/s) overlaps a 100 ms kernel and the other direction, while a second copy in the same direction waits
/// for the first, at exactly the engine's bandwidth. Device-timeline figures (events), all queued behind a
/// 200 ms kernel so the host's speed does not enter them (the bands leave 50 ms regardless). The control:
/// without engines every copy is serialised with the kernel, as before.
#[test]
fn copy_engines_overlap_kernels_and_the_other_direction_but_not_their_own() {
    let s = setup("elastic", "engines");
    let base = [("CUDASIM_SMS", "4"), ("CUDASIM_COPY_GBPS", "0.025")];
    let copy = 1048576.0 / 0.025e6; // ms
    let mut env = base.to_vec();
    env.extend([("CUDASIM_H2D_GBPS", "0.025"), ("CUDASIM_D2H_GBPS", "0.025")]);
    let [h2d, d2h, h2d2, kernel] = engine_figures(&s, &env);
    assert!((99.99..150.0).contains(&kernel), "kernel {kernel}");
    // Figures are printed to the µs.
    assert!((copy - 0.01..copy + 50.0).contains(&h2d), "h2d {h2d}");
    assert!((copy - 0.01..copy + 50.0).contains(&d2h), "d2h {d2h}");
    eprintln!("engines: h2d {h2d:.3} d2h {d2h:.3} second h2d {h2d2:.3} kernel {kernel:.3} ms");
    assert!((h2d2 - h2d - copy).abs() < 0.1, "second h2d {h2d2} after {h2d}");
    // The control: one timeline for all.
    let [h2d, d2h, h2d2, kernel] = engine_figures(&s, &base);
    eprintln!("one timeline: h2d {h2d:.3} d2h {d2h:.3} second h2d {h2d2:.3} kernel {kernel:.3} ms");
    assert!((99.99..150.0).contains(&kernel), "kernel {kernel}");
    assert!(h2d >= kernel + copy - 0.1, "h2d {h2d}");
    assert!(
        d2h >= h2d + copy - 0.1 && h2d2 >= d2h + copy - 0.1,
        "{d2h} {h2d2}"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// The figures a `c/managed.c` mode prints on its first line (after "OK" is checked), on a fresh state file.
fn managed_figures(s: &Setup, mode: &str, env: &[(&str, &str)]) -> Vec<f64> {
    let _ = std::fs::remove_file(s.dir.join("state"));
    let mut all = vec![("CUDASIM_SMS", "4"), ("CUDASIM_MEMORY", "1g")];
    all.extend_from_slice(env);
    let out = run(s, &[mode], &all);
    let mut lines = out.lines();
    let v = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|x| x.parse().expect("a figure"))
        .collect();
    assert_eq!(lines.next(), Some("OK"), "{out}");
    v
}

/// Unified memory as the driver pages it (`CUDASIM_MANAGED=migrate`, `c/managed.c pages`): a managed
/// allocation charges nothing until kernels touch it, then 2 MiB per unit touched (cuMemGetInfo and NVML
/// agree); a kernel reading 6 units not resident takes their migration longer on the device timeline (events):
/// 6 × (2 MiB at 0.1 GB/s + 1 ms) = 131.83 ms, and nothing the second time. The control: without the model the
/// allocation is charged whole at once and no kernel pays.
#[test]
fn managed_memory_is_resident_by_2_mib_units_as_kernels_touch_it_and_migration_takes_device_time() {
    let s = setup("managed", "pages");
    let h2d = [("CUDASIM_H2D_GBPS", "0.1")];
    let on = [
        ("CUDASIM_H2D_GBPS", "0.1"),
        ("CUDASIM_MANAGED", "migrate"),
        ("CUDASIM_MANAGED_FAULT_US", "1000"),
    ];
    let v = managed_figures(&s, "pages", &on);
    eprintln!("migrate: {v:?}");
    assert_eq!(
        v[..3],
        [0.0, 4.0, 16.0],
        "MiB resident: after alloc, 3 MiB over 2 units, all"
    );
    let migration = 6.0 * (2097152.0 / 0.1e6 + 1.0);
    // Exact on the timeline (the kernel itself is 1 µs); the bands leave 50 ms for a host slower than the
    // 200 ms kernel the figures wait behind.
    assert!(
        (migration..migration + 50.0).contains(&v[3]),
        "first {} vs {migration}",
        v[3]
    );
    assert!(v[4] < 5.0, "second {}", v[4]);
    let v = managed_figures(&s, "pages", &h2d);
    eprintln!("resident: {v:?}");
    assert_eq!(v[..3], [16.0, 16.0, 16.0]);
    assert!(v[3] < 5.0 && v[4] < 5.0, "{v:?}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

/// Another process's allocation evicts managed memory instead of failing (`c/managed.c evict`): on a 1 GiB
/// device holding 480 MiB of resident managed memory, a second process's context and 400 MiB succeed by evicting
/// 185 units (370 MiB, what was missing) of the least recently used: re-reading the 64 MiB touched last costs
/// nothing, touching all migrates the 185 back (185 × (2 MiB at 2.5 GB/s + 20 µs) = 158.89 ms on the timeline);
/// the process's own 400 MiB then evicts the 57 of its own units it lacks (48.96 ms to bring back), and every
/// byte is intact. The control: without the model both cuMemAllocs are CUDA_ERROR_OUT_OF_MEMORY (2) and
/// nothing moves.
#[test]
fn another_process_allocation_evicts_least_recently_used_managed_units_and_data_survives() {
    let s = setup("managed", "evict");
    let h2d = [("CUDASIM_H2D_GBPS", "2.5")];
    let on = [("CUDASIM_H2D_GBPS", "2.5"), ("CUDASIM_MANAGED", "migrate")];
    let unit = 2097152.0 / 2.5e6 + 0.02;
    let v = managed_figures(&s, "evict", &on);
    eprintln!("migrate: {v:?}");
    assert_eq!(v[..2], [0.0, 370.0], "child's cuMemAlloc, MiB evicted");
    // Evicting by address instead would have taken the 32 units read last: 27.5 ms.
    assert!(v[2] < 5.0, "recently used units were evicted: {}", v[2]);
    let all = 185.0 * unit;
    assert!((all..all + 50.0).contains(&v[3]), "all {} vs {all}", v[3]);
    assert_eq!(v[4], 0.0, "own cuMemAlloc");
    let again = 57.0 * unit;
    assert!((again..again + 50.0).contains(&v[5]), "again {} vs {again}", v[5]);
    let v = managed_figures(&s, "evict", &h2d);
    eprintln!("resident: {v:?}");
    assert_eq!(v[..2], [2.0, 0.0], "child's cuMemAlloc, MiB evicted");
    assert_eq!(v[4], 2.0, "own cuMemAlloc");
    assert!(v[2] < 5.0 && v[3] < 5.0 && v[5] < 5.0, "{v:?}");
    let _ = std::fs::remove_dir_all(&s.dir);
}
