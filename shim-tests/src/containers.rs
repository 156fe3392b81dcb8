//! Real containers on the simulated GPU (podman + runc; the recipe and its quirks:
//! `../shared/notes/containers-here.md`): a root filesystem holding the programs and the host libraries they,
//! the shim and the simulator load; podman run with the containers.conf the recipe needs; the simulator's
//! libraries and state as the container's driver. Tests using this need root and podman: `#[ignore]`d, run by
//! test.sh as root where podman is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory the container runtime can use: a root filesystem and podman's configuration.
#[derive(Debug)]
pub struct Runtime {
    /// The root filesystem (`--rootfs`).
    pub root: PathBuf,
    conf: PathBuf,
}

impl Runtime {
    /// Builds the root filesystem under `dir`: each of `programs` at `/<file name>`, and every host library
    /// `ldd` lists for them, for the shim and for the simulator.
    pub fn new(dir: &Path, programs: &[&Path]) -> Runtime {
        let root = dir.join("rootfs");
        std::fs::create_dir_all(&root).expect("rootfs dir");
        let mut libs = std::collections::BTreeSet::new();
        let (shim, sim) = (crate::shim_lib(), crate::sim_lib());
        for p in programs.iter().copied().chain([shim.as_path(), sim.as_path()]) {
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
            let to = root.join(l.strip_prefix("/").expect("absolute"));
            std::fs::create_dir_all(to.parent().expect("parent")).expect("lib dir");
            std::fs::copy(&l, &to).unwrap_or_else(|e| panic!("{}: {e}", l.display()));
        }
        for p in programs {
            std::fs::copy(p, root.join(p.file_name().expect("file name"))).expect("copy program");
        }
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=1024:1024\"]\n[engine]\nruntime = \"runc\"\n",
        )
        .expect("containers.conf");
        Runtime { root, conf }
    }

    /// `podman ARGS` with this configuration: (success, stdout + stderr).
    pub fn podman(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("podman")
            .args(args)
            .env("CONTAINERS_CONF", &self.conf)
            .output()
            .expect("run podman");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `podman run --rm [extra…] --rootfs <root> CMD…`.
    pub fn run(&self, extra: &[String], cmd: &[&str]) -> (bool, String) {
        let mut args: Vec<&str> = vec!["run", "--rm"];
        args.extend(extra.iter().map(String::as_str));
        args.extend(["--rootfs", self.root.to_str().expect("utf-8 path")]);
        args.extend(cmd);
        self.podman(&args)
    }
}

/// A bind mount into a container.
#[derive(Debug, Clone)]
pub struct Mount {
    /// The host path.
    pub host: PathBuf,
    /// Where the container sees it.
    pub container: PathBuf,
    /// Read-write (else read-only).
    pub writable: bool,
}

impl Mount {
    /// `-v HOST:CONTAINER:ro|rw` for podman.
    pub fn args(&self) -> [String; 2] {
        let mode = if self.writable { "rw" } else { "ro" };
        [
            "-v".into(),
            format!("{}:{}:{mode}", self.host.display(), self.container.display()),
        ]
    }
}

/// The simulator as a container's driver: `libcuda.so.1` and `libnvidia-ml.so.1` (read-only), and its state
/// file `state` (the host's, shared with the host's observer; it must exist).
pub fn sim_mounts(state: &Path) -> Vec<Mount> {
    let mut l: Vec<Mount> = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    ]
    .iter()
    .map(|c| Mount {
        host: crate::sim_lib(),
        container: c.into(),
        writable: false,
    })
    .collect();
    l.push(Mount {
        host: state.to_path_buf(),
        container: "/var/run/cudasim/state".into(),
        writable: true,
    });
    l
}

/// The simulator's variables for a container: one device of `memory` (`"16g"`) with UUID `uuid`, no
/// context overhead.
pub fn sim_env(memory: &str, uuid: &str) -> Vec<String> {
    vec![
        "CUDASIM_STATE=/var/run/cudasim/state".to_string(),
        "CUDASIM_DEVICES=1".into(),
        format!("CUDASIM_MEMORY={memory}"),
        "CUDASIM_CTX_OVERHEAD=0".into(),
        format!("CUDASIM_UUIDS={uuid}"),
    ]
}

/// `KEY=` of a program's `key=value` output lines, as a number.
pub fn out_val(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e} in:\n{out}"))
}

/// Runs `kubernetes-validate --strict` against Kubernetes 1.37's schemas (installed into `.deps/k8s` by
/// scripts/setup.sh) on `files`: (valid, its output).
pub fn kubernetes_validate<P: AsRef<Path>>(files: &[P]) -> (bool, String) {
    let deps = crate::workspace_root().join(".deps/k8s");
    assert!(
        deps.join("kubernetes_validate").is_dir(),
        "kubernetes-validate is not installed in {}: run scripts/setup.sh (test.sh runs it)",
        deps.display()
    );
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--kubernetes-version",
            "1.37.0",
        ])
        .args(files.iter().map(AsRef::as_ref))
        .env("PYTHONPATH", deps)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
