//! End to end on a real container runtime: the plugin prepares a claim over its gRPC API (as the kubelet
//! would), podman applies the generated CDI spec (`--device cuquota.io/gpu=<claim uid>`) to a container running
//! `alloc_probe` (or a kernel launcher) on the simulated GPU, and the granted memory is the cap inside and the
//! granted SM share the device time it gets (read from the simulator's device timeline); a control run with the
//! same simulator but without the device gets the whole GPU. With the simulator's pid service on the host, NVML
//! reports host pids as NVIDIA's does, and the agent attributes the container's process by its cgroup. Needs root and podman + runc (Debian packages,
//! scripts/setup.sh): `#[ignore]`d, test.sh runs it as root when podman is installed. The recipe's quirks
//! (runc, ulimits, CDI 0.5.0, `bind`) are in containers.conf below and in the plugin's spec.

mod common;

use std::path::{Path, PathBuf};

use common::{Node, GPU, UID};
use cuquota_dra::prepare::ExtraMount;
use shim_tests::containers::{out_val as val, sim_env, sim_mounts, Runtime};
use shim_tests::{compile_c, workspace_root, Sim};

/// One at a time: every test's claim has the fixture's UID, so one CDI spec file in /var/run/cdi.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Removes the claim's CDI spec from the runtime's directory even when the test fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The node, the claim prepared with the simulator's libraries and state in its device, a root filesystem
/// with `programs` in it, and podman's configuration.
struct Setup {
    sim: Sim,
    node: Node,
    _cleanup: Cleanup,
    device: String,
    rt: Runtime,
    _tmp: tempfile::TempDir,
    _pids: Option<PidService>,
    // Last: fields drop in order, so the lock is released after the spec is removed.
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// `cudasim-pidd` serving the simulator's pid socket on the host (the driver's view of host pids).
struct PidService(std::process::Child);

impl PidService {
    /// Where the container sees the socket.
    const IN_CONTAINER: &str = "/var/run/cudasim/pid.sock";

    fn start(socket: &Path) -> PidService {
        let bin = shim_tests::sim_lib().with_file_name("cudasim-pidd");
        let child = std::process::Command::new(&bin)
            .arg(socket)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (cargo build -p cuquota-sim)", bin.display()));
        let s = PidService(child);
        for _ in 0..500 {
            if socket.exists() {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("cudasim-pidd did not create {}", socket.display());
    }
}

impl Drop for PidService {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Setup {
    fn new(programs: &[&Path]) -> Setup {
        Setup::with(programs, false)
    }

    /// With `pid_service`, the claim's device also mounts the simulator's pid socket (NVML reports host pids,
    /// as NVIDIA's does); without, the simulator in the container reports the container's own pids.
    fn with(programs: &[&Path], pid_service: bool) -> Setup {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
        let shim = shim_tests::shim_lib();
        let sim = Sim::new().memory("16g").uuids(GPU).build();
        let state = sim.dir().join("sim.state");
        std::fs::write(&state, b"").unwrap();
        let socket = sim.dir().join("pid.sock");
        let _pids = pid_service.then(|| PidService::start(&socket));
        let node = Node::with(|l| {
            l.library = shim.clone();
            l.cdi_dir = "/var/run/cdi".into();
            l.extra_mounts = sim_mounts(&state)
                .into_iter()
                .map(|m| ExtraMount {
                    host: m.host,
                    container: m.container,
                    writable: m.writable,
                })
                .collect();
            l.extra_env = sim_env("16g", GPU);
            if pid_service {
                l.extra_mounts.push(ExtraMount {
                    host: socket.clone(),
                    container: PidService::IN_CONTAINER.into(),
                    writable: true,
                });
                l.extra_env
                    .push(format!("CUDASIM_PID_SOCKET={}", PidService::IN_CONTAINER));
            }
        });
        let _cleanup = Cleanup(node.layout.cdi_spec_path(UID));
        let r = node.prepare(&[("notebook-gpu", UID)]);
        assert_eq!(r[UID].error, "", "{r:?}");
        let device = r[UID].devices[0].cdi_device_ids[0].clone();
        let tmp = tempfile::tempdir().unwrap();
        let rt = Runtime::new(tmp.path(), programs);
        Setup {
            _serial,
            rt,
            sim,
            node,
            _cleanup,
            device,
            _tmp: tmp,
            _pids,
        }
    }

    /// Runs `cmd` in a container with the claim's device, or (`claim` false) with the simulator mounted by hand
    /// and no device: the control.
    fn run(&self, claim: bool, cmd: &[&str]) -> (bool, String) {
        let mut args: Vec<String> = Vec::new();
        if claim {
            args.extend(["--device".into(), self.device.clone()]);
        } else {
            for m in sim_mounts(&self.sim.dir().join("sim.state")) {
                args.extend(m.args());
            }
            for e in sim_env("16g", GPU) {
                args.extend(["-e".into(), e]);
            }
        }
        self.rt.run(&args, cmd)
    }
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn the_cdi_device_caps_a_real_container_and_a_control_gets_the_whole_gpu() {
    let probe = shim_tests::program(shim_tests::Prog::AllocProbe);
    let s = Setup::new(&[&probe]);

    // The claim: 4Gi of the 16 GiB GPU.
    let (ok, out) = s.run(true, &["/alloc_probe", "256m"]);
    assert!(ok, "podman run with the claim's device failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 4096, "{out}");
    let got = val(&out, "allocated_mib");
    assert!(
        (3584..=4096).contains(&got),
        "allocated {got} MiB under a 4 GiB claim:\n{out}"
    );

    // The control: the same simulator, mounted by hand, no device: no cuquota, the whole GPU.
    let (ok, out) = s.run(false, &["/alloc_probe", "256m"]);
    assert!(ok, "the control run failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 16384, "{out}");
    assert!(
        val(&out, "allocated_mib") > 8192,
        "the control is not limited:\n{out}"
    );

    // Unprepared, the device is gone: the runtime refuses to start the container (fails closed).
    assert_eq!(s.node.unprepare(UID), "");
    let (ok, out) = s.run(true, &["/alloc_probe"]);
    assert!(
        !ok,
        "a container with an unprepared claim's device started:\n{out}"
    );
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn after_a_reboot_the_next_prepare_brings_the_cdi_device_back_and_the_container_starts() {
    let probe = shim_tests::program(shim_tests::Prog::AllocProbe);
    let mut s = Setup::new(&[&probe]);
    // Reboot: the plugin stops, /var/run/cdi (a tmpfs) loses the claim's spec; the state directory stays.
    s.node.stop();
    std::fs::remove_file(s.node.layout.cdi_spec_path(UID)).unwrap();
    let (ok, out) = s.run(true, &["/alloc_probe", "256m"]);
    assert!(!ok, "control: a container started without the CDI spec:\n{out}");
    // The plugin starts again with the API unreachable; the kubelet prepares the claim again.
    std::fs::rename(s.node.p("claims"), s.node.p("claims.away")).unwrap();
    s.node.start();
    let r = s.node.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    let (ok, out) = s.run(true, &["/alloc_probe", "256m"]);
    assert!(ok, "the container did not start after the reboot:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 4096, "{out}");
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn the_cdi_device_holds_the_granted_sm_share_in_a_real_container() {
    // 1 ms kernels launched flat out for 3 s (a few hundred launches a second: a busy CPU keeps up).
    let launcher = compile_c(
        "throttle_paths_direct",
        &workspace_root().join("shim-tests/c/throttle_paths.c"),
        &[],
        &["-DTHR_DIRECT", "-lcuda", "-ldl"],
    );
    let s = Setup::new(&[&launcher]);
    let share = |claim: bool| {
        let (ok, out) = s.run(
            claim,
            &["/throttle_paths_direct", "kernel", "direct", "3", "1000000"],
        );
        assert!(ok, "podman run failed:\n{out}");
        // CLOCK_MONOTONIC is the host's in the container; pid 0 = every process on the simulated GPU.
        let (t0, end) = (val(&out, "t0_ns"), val(&out, "end_ns"));
        (s.sim.share_pct(0, 0, t0 + 500_000_000, end), out)
    };
    // The claim: 30 % of the SM time, hard.
    let (claimed, out) = share(true);
    assert!(
        (15.0..=45.0).contains(&claimed),
        "share {claimed:.1} % under a hard 30 % claim:\n{out}"
    );
    eprintln!("share under a hard 30 % claim: {claimed:.1} %");
    let (control, out) = share(false);
    eprintln!("share of the control: {control:.1} %");
    assert!(control > 80.0, "the control ran at {control:.1} %:\n{out}");
}

/// Removes a detached container even when the test fails.
struct Container<'a>(&'a Runtime, String);

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.0.podman(&["rm", "-f", "-t", "0", &self.1]);
    }
}

/// What the host and the container see of a container process holding 100 MiB on the simulated GPU, beside a
/// host process holding 50 MiB: (the process's host pid, the pids NVML lists inside the container, the agent's
/// report of the claim's container as JSON).
fn pids_seen(pid_service: bool) -> (u64, Vec<u64>, serde_json::Value) {
    let probe = shim_tests::program(shim_tests::Prog::ProbeDirect);
    let nvml = shim_tests::program(shim_tests::Prog::NvmlProbe);
    let s = Setup::with(&[&probe, &nvml], pid_service);
    let mut neighbour = s
        .sim
        .cmd(shim_tests::Prog::Probe)
        .no_preload()
        .args("init alloc:mem:50m wait")
        .spawn();
    neighbour.wait_ready(1);

    let mut args: Vec<String> = ["run", "-d", "--device", &s.device, "--rootfs"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.push(s.rt.root.display().to_string());
    args.extend(["/probe_direct", "init", "pid", "alloc:mem:100m", "sleep:60000"].map(String::from));
    let (ok, out) = s.rt.podman(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "podman run -d failed:\n{out}");
    let c = Container(&s.rt, out.trim().lines().last().unwrap_or("").to_string());
    // The probe is the container's pid 1; podman knows its host pid.
    let (ok, out) = s.rt.podman(&["inspect", "-f", "{{.State.Pid}}", &c.1]);
    assert!(ok, "{out}");
    let host_pid: u64 = out.trim().parse().unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut logs = String::new();
    for _ in 0..300 {
        logs = s.rt.podman(&["logs", &c.1]).1;
        if logs.contains("alloc.0=") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        logs.contains("alloc.0=CUDA_SUCCESS"),
        "the probe did not allocate:\n{logs}"
    );

    // NVML inside the container, through cuquota's per-process filter.
    // podman exec does not apply the CDI device's env: pass it as the container's processes have it.
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.node.layout.cdi_spec_path(UID)).unwrap()).unwrap();
    let mut exec: Vec<String> = vec!["exec".into()];
    for edits in [&spec["containerEdits"], &spec["devices"][0]["containerEdits"]] {
        for e in edits["env"].as_array().into_iter().flatten() {
            exec.extend(["-e".into(), e.as_str().unwrap().to_string()]);
        }
    }
    exec.push(c.1.clone());
    let run_in = |cmd: &[&str]| {
        let mut a: Vec<&str> = exec.iter().map(String::as_str).collect();
        a.extend(cmd);
        s.rt.podman(&a)
    };
    // A second process fills the claim beside the first: near the cap the library reconciles its accounting
    // with NVML's list, which must know both by the pids they recorded.
    let (ok, out) = run_in(&["/probe_direct", "init", "fill:mem:256m"]);
    assert!(ok, "the fill in the container failed:\n{out}");
    let filled = val(&out, "fill.count") * 256;
    eprintln!("pid service {pid_service}: a second process filled {filled} MiB");
    assert!(
        (3328..=3840).contains(&filled),
        "filled {filled} MiB beside 100 MiB under a 4 GiB claim:\n{out}"
    );
    let (ok, out) = run_in(&["/nvml_probe", "procs:0"]);
    assert!(ok, "nvml_probe in the container failed:\n{out}");
    let listed: Vec<u64> = out
        .lines()
        .find_map(|l| l.strip_prefix("procs.0.v3="))
        .unwrap_or_else(|| panic!("no procs.0.v3= in:\n{out}"))
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| e.split(':').next().unwrap().parse().unwrap())
        .collect();

    // The agent on the host: the pod's cgroup is the container's (a link where the kubelet would have made
    // it), and the plugin writes the descriptor when the kubelet asks again.
    let cgroup = ["memory", "pids", "unified", ""]
        .iter()
        .map(|h| {
            Path::new("/sys/fs/cgroup")
                .join(h)
                .join(format!("libpod_parent/libpod-{}", c.1))
        })
        .find(|p| p.join("cgroup.procs").is_file())
        .expect("the container's cgroup");
    let link = s
        .node
        .layout
        .cgroup_root
        .join(format!("kubepods/pod{}", common::POD_UID));
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&cgroup, &link).unwrap();
    let r = s.node.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    let agent_dir = s.node.layout.agent_dir.clone().unwrap();
    let out = s.sim.cli(&[
        "agent",
        "--containers",
        agent_dir.to_str().unwrap(),
        "--once",
        "--json",
    ]);
    assert!(out.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.lines.join("\n")).unwrap();
    let containers = v["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{v}");
    neighbour.finish();
    (host_pid, listed, containers[0].clone())
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn nvml_reports_host_pids_so_the_agent_attributes_a_real_container_by_its_cgroup() {
    let (host_pid, listed, c) = pids_seen(true);
    eprintln!("host pid {host_pid}; NVML in the container lists {listed:?}");
    // Inside: the container's own process only (not the host's neighbour), by its host pid.
    assert_eq!(listed, [host_pid], "NVML in the container");
    // The host: the agent finds the process in the pod's cgroup and NVML's figure for it.
    assert!(c["error"].is_null(), "{c}");
    let members: Vec<u64> = c["members"]["pids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.as_u64())
        .collect();
    assert!(members.contains(&host_pid), "{c}");
    let d = &c["devices"][0];
    assert_eq!(d["processes"][0]["pid"], host_pid, "{c}");
    assert!(
        d["memory_used_bytes"].as_u64().unwrap() >= 100 << 20,
        "the agent's figure for the claim:{c}"
    );

    // The control: without the pid service the simulator reports the container's pid 1, as no driver does,
    // and the agent cannot attribute the process to the cgroup it is in.
    let (host_pid, listed, c) = pids_seen(false);
    assert_eq!(listed, [1], "NVML in the container without the pid service");
    let members = c["members"]["pids"].as_array().unwrap();
    assert!(members.iter().any(|p| p.as_u64() == Some(host_pid)), "{c}");
    assert_eq!(
        c["devices"][0]["processes"].as_array().map_or(0, Vec::len),
        0,
        "the agent attributed a process NVML knows by a pid outside the cgroup:{c}"
    );
}

/// A node's NVIDIA driver, faked: `root/driver` holds the simulator as `libcuda.so.999.0` and
/// `libnvidia-ml.so.999.0` with their `.so.1` links (the driver's layout), `root/dev` the device nodes, made
/// with /dev/null's numbers (1, 3).
fn fake_driver(root: &Path) {
    let lib = root.join("driver/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    for name in ["libcuda", "libnvidia-ml"] {
        std::fs::copy(shim_tests::sim_lib(), lib.join(format!("{name}.so.999.0"))).unwrap();
        std::os::unix::fs::symlink(format!("{name}.so.999.0"), lib.join(format!("{name}.so.1"))).unwrap();
    }
    let dev = root.join("dev/dev");
    std::fs::create_dir_all(&dev).unwrap();
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0"] {
        let p = std::ffi::CString::new(dev.join(n).to_str().unwrap()).unwrap();
        // SAFETY: p is a NUL-terminated path; mknod has no other preconditions.
        let rc = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(rc, 0, "mknod {n}: {}", std::io::Error::last_os_error());
    }
}

/// A node whose plugin finds the GPU through `driver` (or not at all), the simulator's state file its only
/// hand-given mount: the claim prepared, its CDI device ids.
fn driver_node(
    state: &Path,
    driver: Option<cuquota_dra::gpu_access::DriverFiles>,
) -> (Node, Cleanup, Vec<String>) {
    let node = Node::with(|l| {
        l.library = shim_tests::shim_lib();
        l.cdi_dir = "/var/run/cdi".into();
        // The simulator's state stands in for the kernel driver's: not a driver library, not a device node.
        l.extra_mounts = sim_mounts(state)
            .into_iter()
            .filter(|m| m.writable)
            .map(|m| ExtraMount {
                host: m.host,
                container: m.container,
                writable: m.writable,
            })
            .collect();
        l.extra_env = sim_env("16g", GPU);
        l.driver = driver;
    });
    let cleanup = Cleanup(node.layout.cdi_spec_path(UID));
    let r = node.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    let ids = r[UID].devices[0].cdi_device_ids.clone();
    (node, cleanup, ids)
}

fn device_args(ids: &[String]) -> Vec<String> {
    ids.iter()
        .flat_map(|d| ["--device".to_string(), d.clone()])
        .collect()
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn the_claims_cdi_device_alone_brings_the_driver_and_device_nodes_the_node_has() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let probe = shim_tests::program(shim_tests::Prog::AllocProbe);
    let tmp = tempfile::tempdir().unwrap();
    fake_driver(tmp.path());
    let _sim = Sim::new().memory("16g").uuids(GPU).build();
    let state = tmp.path().join("sim.state");
    std::fs::write(&state, b"").unwrap();
    let rt = Runtime::new(&tmp.path().join("rt"), &[&probe, Path::new("/bin/ls")]);

    // The control, main's plugin without --mount/--device-node: the device brings no driver, and the program
    // cannot load libcuda.so.1.
    let (node, cleanup, ids) = driver_node(&state, None);
    assert_eq!(ids, [format!("cuquota.io/gpu={UID}")]);
    let (ok, out) = rt.run(&device_args(&ids), &["/alloc_probe", "256m"]);
    assert!(
        !ok && !out.contains("meminfo_total_mib="),
        "a container got a GPU without its driver:\n{out}"
    );
    assert_eq!(node.unprepare(UID), "");
    drop(cleanup);

    // The node's driver, found by the plugin: the same claim's device alone runs the program under its cap.
    let driver = cuquota_dra::gpu_access::DriverFiles {
        host_root: "/".into(),
        driver_root: tmp.path().join("driver"),
        dev_root: tmp.path().join("dev"),
        // No NVIDIA spec on this node.
        cdi_dirs: vec![tmp.path().join("no-cdi")],
    };
    let (node, _cleanup, ids) = driver_node(&state, Some(driver));
    assert_eq!(ids, [format!("cuquota.io/gpu={UID}")]);
    let (ok, out) = rt.run(&device_args(&ids), &["/alloc_probe", "256m"]);
    assert!(ok, "podman run with the claim's device alone failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 4096, "{out}");
    let got = val(&out, "allocated_mib");
    assert!(
        (3584..=4096).contains(&got),
        "allocated {got} MiB under a 4 GiB claim:\n{out}"
    );
    // The device nodes are in the container, character devices with the host's numbers.
    let (ok, out) = rt.run(
        &device_args(&ids),
        &[
            "/ls",
            "-l",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia0",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with('c') && l.contains("1, 3"))
            .count(),
        4,
        "{out}"
    );
    assert_eq!(node.unprepare(UID), "");
}

/// Removes a file even when the test fails.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn nvidias_cdi_device_for_the_gpu_is_answered_beside_the_claims_own() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let probe = shim_tests::program(shim_tests::Prog::AllocProbe);
    let tmp = tempfile::tempdir().unwrap();
    fake_driver(tmp.path());
    let _sim = Sim::new().memory("16g").uuids(GPU).build();
    let state = tmp.path().join("sim.state");
    std::fs::write(&state, b"").unwrap();
    let rt = Runtime::new(&tmp.path().join("rt"), &[&probe]);

    // NVIDIA's spec on the node (as `nvidia-ctk cdi generate` writes it: devices by index and UUID, the
    // control nodes and libraries common), over the fake driver.
    let (lib, dev) = (
        tmp.path().join("driver/usr/lib/x86_64-linux-gnu"),
        tmp.path().join("dev/dev"),
    );
    let node = |n: &str| serde_json::json!({"path": format!("/dev/{n}"), "hostPath": dev.join(n)});
    let mount = |n: &str| {
        serde_json::json!({"hostPath": lib.join(format!("{n}.so.999.0")),
            "containerPath": format!("/usr/lib/x86_64-linux-gnu/{n}.so.1"), "options": ["ro", "nosuid", "nodev", "bind"]})
    };
    let gpu0 = serde_json::json!({"deviceNodes": [node("nvidia0")]});
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": gpu0}, {"name": GPU, "containerEdits": gpu0}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("nvidiactl"), node("nvidia-uvm"), node("nvidia-uvm-tools")],
            "mounts": [mount("libcuda"), mount("libnvidia-ml")],
        },
    });
    let nvidia = RemoveOnDrop("/var/run/cdi/nvidia-cuquota-test.json".into());
    // On a fresh node nothing has made the CDI directory yet (this test may run before the plugin's).
    std::fs::create_dir_all("/var/run/cdi").unwrap();
    std::fs::write(&nvidia.0, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

    // The plugin's own driver search finds nothing here: only NVIDIA's spec can give the GPU.
    let driver = cuquota_dra::gpu_access::DriverFiles {
        host_root: "/".into(),
        driver_root: tmp.path().join("empty"),
        dev_root: tmp.path().join("empty"),
        cdi_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
    };
    let (node, _cleanup, ids) = driver_node(&state, Some(driver));
    assert_eq!(
        ids,
        [format!("cuquota.io/gpu={UID}"), format!("nvidia.com/gpu={GPU}")]
    );
    let ours: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.layout.cdi_spec_path(UID)).unwrap()).unwrap();
    let edits = &ours["devices"][0]["containerEdits"];
    assert!(edits["deviceNodes"].is_null(), "{edits}");
    assert!(!edits.to_string().contains("libcuda"), "{edits}");

    // Both devices, as the kubelet passes them: the GPU, under the claim's cap.
    let (ok, out) = rt.run(&device_args(&ids), &["/alloc_probe", "256m"]);
    assert!(ok, "podman run with both devices failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 4096, "{out}");
    let got = val(&out, "allocated_mib");
    assert!(
        (3584..=4096).contains(&got),
        "allocated {got} MiB under a 4 GiB claim:\n{out}"
    );
    // The control: NVIDIA's device alone (with the simulator's state by hand, as the kernel driver would
    // be there) is the whole GPU, without cuquota.
    let mut args = device_args(&ids[1..]);
    for m in sim_mounts(&state).into_iter().filter(|m| m.writable) {
        args.extend(m.args());
    }
    for e in sim_env("16g", GPU) {
        args.extend(["-e".into(), e]);
    }
    let (ok, out) = rt.run(&args, &["/alloc_probe", "256m"]);
    assert!(ok, "podman run with NVIDIA's device alone failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 16384, "{out}");
    assert_eq!(node.unprepare(UID), "");
}
