//! End to end on a real container runtime: the plugin prepares a claim over its gRPC API (as the kubelet
//! would), podman applies the generated CDI spec (`--device cuquota.io/gpu=<claim uid>`) to a container running
//! `alloc_probe` on the simulated GPU, and the granted memory is the cap inside; a control run with the same
//! simulator but without the device gets the whole GPU. Needs root and podman + runc (Debian packages,
//! scripts/setup.sh): `#[ignore]`d, test.sh runs it as root when podman is installed. The recipe's quirks
//! (runc, ulimits, CDI 0.5.0, `bind`) are in containers.conf below and in the plugin's spec.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Node, GPU, UID};
use cuquota_dra::prepare::ExtraMount;

/// The minimal root filesystem: the program and the host libraries it, the shim and the simulator load.
fn rootfs(dir: &Path, programs: &[&Path]) -> PathBuf {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    let mut libs = std::collections::BTreeSet::new();
    for p in programs {
        let out = Command::new("ldd").arg(p).output().expect("ldd");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = line
                .split("=>")
                .last()
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("");
            if path.starts_with('/') {
                libs.insert(PathBuf::from(path));
            }
        }
    }
    for l in libs {
        let to = root.join(l.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&l, &to).unwrap_or_else(|e| panic!("{}: {e}", l.display()));
    }
    root
}

fn podman(conf: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", conf)
        .output()
        .expect("run podman");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn val(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .trim()
        .parse()
        .unwrap()
}

/// Removes the claim's CDI spec from the runtime's directory even when the test fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root, podman and runc (test.sh runs it as root where podman is installed)"]
fn the_cdi_device_caps_a_real_container_and_a_control_gets_the_whole_gpu() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let probe = shim_tests::program(shim_tests::Prog::AllocProbe);
    let shim = shim_tests::shim_lib();
    let sim = shim_tests::sim_lib();
    let sim_env = [
        "CUDASIM_STATE=/var/run/cudasim/state".to_string(),
        "CUDASIM_DEVICES=1".into(),
        "CUDASIM_MEMORY=16g".into(),
        "CUDASIM_CTX_OVERHEAD=0".into(),
        format!("CUDASIM_UUIDS={GPU}"),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("sim.state");
    std::fs::write(&state, b"").unwrap();
    let sim_mounts = |l: &mut Vec<ExtraMount>| {
        for c in [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ] {
            l.push(ExtraMount {
                host: sim.clone(),
                container: c.into(),
                writable: false,
            });
        }
        l.push(ExtraMount {
            host: state.clone(),
            container: "/var/run/cudasim/state".into(),
            writable: true,
        });
    };
    let n = Node::with(|l| {
        l.library = shim.clone();
        l.cdi_dir = "/var/run/cdi".into();
        sim_mounts(&mut l.extra_mounts);
        l.extra_env = sim_env.to_vec();
    });
    let _cleanup = Cleanup(n.layout.cdi_spec_path(UID));
    let r = n.prepare(&[("notebook-gpu", UID)]);
    assert_eq!(r[UID].error, "", "{r:?}");
    let id = &r[UID].devices[0].cdi_device_ids[0];

    let root = rootfs(tmp.path(), &[&probe, &shim, &sim]);
    std::fs::copy(&probe, root.join("alloc_probe")).unwrap();
    let conf = tmp.path().join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=1024:1024\"]\n[engine]\nruntime = \"runc\"\n",
    )
    .unwrap();
    let root_s = root.display().to_string();

    // The claim: 4Gi of the 16 GiB GPU.
    let (ok, out) = podman(
        &conf,
        &[
            "run",
            "--rm",
            "--device",
            id,
            "--rootfs",
            &root_s,
            "/alloc_probe",
            "256m",
        ],
    );
    assert!(ok, "podman run with the claim's device failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 4096, "{out}");
    let got = val(&out, "allocated_mib");
    assert!(
        (3584..=4096).contains(&got),
        "allocated {got} MiB under a 4 GiB claim:\n{out}"
    );

    // The control: the same simulator, mounted by hand, no device: no cuquota, the whole GPU.
    let mut args: Vec<String> = vec!["run".into(), "--rm".into()];
    let mut ms = Vec::new();
    sim_mounts(&mut ms);
    for m in &ms {
        let mode = if m.writable { "rw" } else { "ro" };
        args.push("-v".into());
        args.push(format!("{}:{}:{mode}", m.host.display(), m.container.display()));
    }
    for e in &sim_env {
        args.push("-e".into());
        args.push(e.clone());
    }
    args.extend([
        "--rootfs".into(),
        root_s.clone(),
        "/alloc_probe".into(),
        "256m".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out) = podman(&conf, &args);
    assert!(ok, "the control run failed:\n{out}");
    assert_eq!(val(&out, "meminfo_total_mib"), 16384, "{out}");
    assert!(
        val(&out, "allocated_mib") > 8192,
        "the control is not limited:\n{out}"
    );

    // Unprepared, the device is gone: the runtime refuses to start the container (fails closed).
    assert_eq!(n.unprepare(UID), "");
    let (ok, out) = podman(
        &conf,
        &["run", "--rm", "--device", id, "--rootfs", &root_s, "/alloc_probe"],
    );
    assert!(
        !ok,
        "a container with an unprepared claim's device started:\n{out}"
    );
}
