//! End to end on a real container runtime: the plugin prepares a claim over its gRPC API (as the kubelet
//! would), podman applies the generated CDI spec (`--device cuquota.io/gpu=<claim uid>`) to a container running
//! `alloc_probe` (or a kernel launcher) on the simulated GPU, and the granted memory is the cap inside and the
//! granted SM share the device time it gets (read from the simulator's device timeline); a control run with the
//! same simulator but without the device gets the whole GPU. Needs root and podman + runc (Debian packages,
//! scripts/setup.sh): `#[ignore]`d, test.sh runs it as root when podman is installed. The recipe's quirks
//! (runc, ulimits, CDI 0.5.0, `bind`) are in containers.conf below and in the plugin's spec.

mod common;

use std::path::{Path, PathBuf};

use common::{Node, GPU, UID};
use cuquota_dra::prepare::ExtraMount;
use shim_tests::containers::{out_val as val, sim_env, sim_mounts, Runtime};
use shim_tests::{compile_c, workspace_root, Sim};

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
    // Last: fields drop in order, so the lock is released after the spec is removed.
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Setup {
    fn new(programs: &[&Path]) -> Setup {
        // One at a time: both tests' claims have the fixture's UID, so one CDI spec file in /var/run/cdi.
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
        let shim = shim_tests::shim_lib();
        let sim = Sim::new().memory("16g").uuids(GPU).build();
        let state = sim.dir().join("sim.state");
        std::fs::write(&state, b"").unwrap();
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
