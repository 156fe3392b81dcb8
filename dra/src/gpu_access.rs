//! The GPU itself in a claim's containers: the device nodes and the driver's user-space libraries. Where the
//! node has NVIDIA's CDI spec (`nvidia-ctk cdi generate`, the GPU operator) with a device named by the GPU's
//! UUID, the claim is answered with `nvidia.com/gpu=<UUID>` beside its own device and NVIDIA's spec brings them
//! (its hooks included); where it has none, the claim's own device brings what the node has: `/dev/nvidiactl`,
//! `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`, `/dev/nvidiaN`, and the driver's
//! compute and utility libraries (`libcuda.so.*`, `libnvidia-ml.so.*`, …) at the paths they have on the host.
//! Nothing found is an error naming what is missing: a pod without a usable GPU should not start quietly.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The CDI kind of NVIDIA's GPU devices.
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";

/// The driver libraries a CUDA or NVML program loads (libnvidia-container's compute and utility sets, as
/// `nvidia-ctk cdi generate` mounts them); a library the node lacks is skipped, except `libcuda`.
pub const DRIVER_LIBRARIES: &[&str] = &[
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-cfg",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-nvvm",
    "libnvidia-pkcs11",
];

/// The library directories searched, relative to the driver root (Debian/Ubuntu, Red Hat, others).
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
];

/// The device nodes every GPU user needs besides its GPU's `/dev/nvidiaN`.
pub const CONTROL_NODES: &[&str] = &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// Where the node's driver files are, and how the plugin sees them.
#[derive(Debug, Clone)]
pub struct DriverFiles {
    /// Where the plugin sees the node's `/` (a hostPath mount in its pod); every path written into a spec is
    /// the host's.
    pub host_root: PathBuf,
    /// The driver's root on the host: `/`, or the GPU operator's `/run/nvidia/driver`.
    pub driver_root: PathBuf,
    /// The device nodes are `DEV_ROOT/dev/nvidia*` on the host (`/`).
    pub dev_root: PathBuf,
    /// Host directories searched for NVIDIA's CDI spec (`/etc/cdi`, `/var/run/cdi`).
    pub cdi_dirs: Vec<PathBuf>,
}

/// A device node of a spec: the container's path and the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// In the container (`/dev/nvidia0`).
    pub path: PathBuf,
    /// On the host.
    pub host_path: PathBuf,
}

/// A read-only mount of a driver library: host path, container path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// On the host (the file, symlinks resolved).
    pub host_path: PathBuf,
    /// In the container: the name the loader looks for (`…/libcuda.so.1`), as on the host.
    pub path: PathBuf,
}

/// How a claim's containers get their GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuAccess {
    /// NVIDIA's CDI devices (`nvidia.com/gpu=<UUID>`), answered beside the claim's own.
    Nvidia(Vec<String>),
    /// The claim's own device brings the nodes and libraries.
    Own {
        /// Device nodes.
        nodes: Vec<Node>,
        /// Driver libraries.
        libraries: Vec<Library>,
    },
}

/// Why a claim's containers cannot be given their GPUs on this node.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// NVIDIA's CDI spec names some of the GPUs, not all: it is stale.
    #[error(
        "NVIDIA's CDI spec on the node names GPUs {found:?} but not {missing:?}: regenerate it \
         (nvidia-ctk cdi generate --device-name-strategy=uuid)"
    )]
    StaleNvidiaSpec {
        /// The GPUs it names.
        found: Vec<String>,
        /// The GPUs it does not.
        missing: Vec<String>,
    },
    /// No `nvidiactl`.
    #[error(
        "no {}: the node has no NVIDIA driver loaded (or --dev-root is wrong) and no NVIDIA CDI spec names the GPU",
        .0.display()
    )]
    NoControlNode(PathBuf),
    /// The device directory could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No `nvidiaN`.
    #[error("no {}/nvidia<N> GPU device node", .0.display())]
    NoGpuNode(PathBuf),
    /// No `libcuda.so.1` under the driver root.
    #[error(
        "no libcuda.so.1 in {} under the driver root {}: the node has no NVIDIA driver libraries (or \
         --driver-root is wrong) and no NVIDIA CDI spec names the GPU",
        LIBRARY_DIRS.join(", "),
        .0.display()
    )]
    NoLibcuda(PathBuf),
}

impl DriverFiles {
    /// The node's defaults: everything at `/`, NVIDIA's spec in `/etc/cdi` or `/var/run/cdi`.
    pub fn host() -> DriverFiles {
        DriverFiles {
            host_root: "/".into(),
            driver_root: "/".into(),
            dev_root: "/".into(),
            cdi_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
        }
    }

    /// Where the plugin sees host path `p`.
    fn seen(&self, p: &Path) -> PathBuf {
        self.host_root.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// The host path of `p` as the plugin sees it.
    fn host_path(&self, seen: &Path) -> PathBuf {
        match seen.strip_prefix(&self.host_root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => seen.to_path_buf(),
        }
    }

    /// How the containers of a claim on `uuids` get them.
    pub fn access(&self, uuids: &[&str]) -> Result<GpuAccess, AccessError> {
        if let Some(ids) = self.nvidia_devices(uuids)? {
            return Ok(GpuAccess::Nvidia(ids));
        }
        let (nodes, libraries) = (self.device_nodes()?, self.libraries()?);
        Ok(GpuAccess::Own { nodes, libraries })
    }

    /// `nvidia.com/gpu=<UUID>` for each of `uuids` when NVIDIA's spec on the node names every one of them;
    /// `None` when no spec does (some but not all: an error, the node's spec is stale).
    pub fn nvidia_devices(&self, uuids: &[&str]) -> Result<Option<Vec<String>>, AccessError> {
        let mut names: Vec<String> = Vec::new();
        for dir in &self.cdi_dirs {
            let Ok(rd) = fs::read_dir(self.seen(dir)) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
                if !matches!(ext, "json" | "yaml" | "yml") {
                    continue;
                }
                let Ok(text) = fs::read_to_string(&p) else {
                    continue;
                };
                // YAML reads JSON too. Another vendor's unreadable spec is not ours to judge.
                let Ok(spec) = serde_saphyr::from_str::<Value>(&text) else {
                    continue;
                };
                if spec["kind"] != NVIDIA_KIND {
                    continue;
                }
                for d in spec["devices"].as_array().into_iter().flatten() {
                    if let Some(n) = d["name"].as_str() {
                        names.push(n.to_string());
                    }
                }
            }
        }
        let found: Vec<&str> = uuids
            .iter()
            .copied()
            .filter(|u| names.iter().any(|n| n == u))
            .collect();
        if found.is_empty() {
            return Ok(None);
        }
        if found.len() < uuids.len() {
            let missing: Vec<&str> = uuids.iter().copied().filter(|u| !found.contains(u)).collect();
            return Err(AccessError::StaleNvidiaSpec {
                found: found.iter().map(|s| s.to_string()).collect(),
                missing: missing.iter().map(|s| s.to_string()).collect(),
            });
        }
        Ok(Some(uuids.iter().map(|u| format!("{NVIDIA_KIND}={u}")).collect()))
    }

    /// `/dev/nvidiactl` and the other control nodes present, and every `/dev/nvidiaN` (a GPU the claim was
    /// not granted gets nothing from the limits file). Errors without `nvidiactl` or any `nvidiaN`.
    pub fn device_nodes(&self) -> Result<Vec<Node>, AccessError> {
        let dev = self.seen(&self.dev_root.join("dev"));
        let node = |name: &str| Node {
            path: Path::new("/dev").join(name),
            host_path: self.host_path(&dev.join(name)),
        };
        let mut nodes: Vec<Node> = CONTROL_NODES
            .iter()
            .filter(|n| dev.join(n).exists())
            .map(|n| node(n))
            .collect();
        if !nodes.iter().any(|n| n.path == Path::new("/dev/nvidiactl")) {
            return Err(AccessError::NoControlNode(dev.join("nvidiactl")));
        }
        let mut gpus: Vec<(u32, String)> = fs::read_dir(&dev)
            .map_err(|source| AccessError::Read {
                path: dev.clone(),
                source,
            })?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let n = name.strip_prefix("nvidia")?.parse().ok()?;
                Some((n, name))
            })
            .collect();
        if gpus.is_empty() {
            return Err(AccessError::NoGpuNode(dev));
        }
        gpus.sort();
        nodes.extend(gpus.iter().map(|(_, name)| node(name)));
        Ok(nodes)
    }

    /// The driver libraries under the driver root: every `LIB.so.*` name of [`DRIVER_LIBRARIES`] in
    /// [`LIBRARY_DIRS`], each mounted at its own name from the file it resolves to. Errors without
    /// `libcuda.so.1`.
    pub fn libraries(&self) -> Result<Vec<Library>, AccessError> {
        let root = self.seen(&self.driver_root);
        let mut out: Vec<Library> = Vec::new();
        for rel in LIBRARY_DIRS {
            let dir = root.join(rel);
            let Ok(rd) = fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    DRIVER_LIBRARIES
                        .iter()
                        .any(|l| n.strip_prefix(l).is_some_and(|s| s.starts_with(".so.")))
                })
                .collect();
            names.sort();
            for n in names {
                let path = Path::new("/").join(rel).join(&n);
                if out.iter().any(|l| l.path == path) {
                    continue;
                }
                let Some(file) = self.resolve(&dir.join(&n), &root) else {
                    continue;
                };
                out.push(Library {
                    host_path: self.host_path(&file),
                    path,
                });
            }
        }
        if !out.iter().any(|l| l.path.ends_with("libcuda.so.1")) {
            return Err(AccessError::NoLibcuda(root));
        }
        Ok(out)
    }

    /// The regular file `p` names, following symlinks as the driver root would (an absolute target is under
    /// `root`, not the plugin's own `/`); `None` for a dangling link or a loop.
    fn resolve(&self, p: &Path, root: &Path) -> Option<PathBuf> {
        let mut p = p.to_path_buf();
        for _ in 0..16 {
            let meta = fs::symlink_metadata(&p).ok()?;
            if !meta.file_type().is_symlink() {
                return meta.is_file().then_some(p);
            }
            let target = fs::read_link(&p).ok()?;
            p = if target.is_absolute() {
                root.join(target.strip_prefix("/").ok()?)
            } else {
                p.parent()?.join(target)
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn driver(dir: &Path) -> DriverFiles {
        DriverFiles {
            host_root: dir.join("host"),
            driver_root: "/run/nvidia/driver".into(),
            dev_root: "/".into(),
            cdi_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
        }
    }

    fn touch(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"").unwrap();
    }

    #[test]
    fn finds_nodes_and_libraries_under_the_roots_and_names_host_paths() {
        let t = tempfile::tempdir().unwrap();
        let d = driver(t.path());
        let host = t.path().join("host");
        for n in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia1",
            "nvidia0",
            "nvidia-caps",
            "null",
        ] {
            touch(&host.join("dev").join(n));
        }
        let lib = host.join("run/nvidia/driver/usr/lib/x86_64-linux-gnu");
        touch(&lib.join("libcuda.so.550.1"));
        touch(&lib.join("libnvidia-ml.so.550.1"));
        touch(&lib.join("libnvidia-mlx.so.1"));
        symlink("libcuda.so.550.1", lib.join("libcuda.so.1")).unwrap();
        // An absolute link is the driver root's, not the plugin's.
        symlink(
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1",
            lib.join("libnvidia-ml.so.1"),
        )
        .unwrap();
        symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
        symlink("missing", lib.join("libnvidia-cfg.so.1")).unwrap();

        let nodes: Vec<(String, String)> = d
            .device_nodes()
            .unwrap()
            .into_iter()
            .map(|n| (n.path.display().to_string(), n.host_path.display().to_string()))
            .collect();
        let want: Vec<(String, String)> = ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"]
            .iter()
            .map(|n| (format!("/dev/{n}"), format!("/dev/{n}")))
            .collect();
        assert_eq!(nodes, want);

        let libs: Vec<(String, String)> = d
            .libraries()
            .unwrap()
            .into_iter()
            .map(|l| (l.path.display().to_string(), l.host_path.display().to_string()))
            .collect();
        let (c, h) = (
            "/usr/lib/x86_64-linux-gnu",
            "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
        );
        assert_eq!(
            libs,
            [
                (format!("{c}/libcuda.so.1"), format!("{h}/libcuda.so.550.1")),
                (format!("{c}/libcuda.so.550.1"), format!("{h}/libcuda.so.550.1")),
                (
                    format!("{c}/libnvidia-ml.so.1"),
                    format!("{h}/libnvidia-ml.so.550.1")
                ),
                (
                    format!("{c}/libnvidia-ml.so.550.1"),
                    format!("{h}/libnvidia-ml.so.550.1")
                ),
            ]
        );
        assert_eq!(
            d.access(&["GPU-1"]).unwrap(),
            GpuAccess::Own {
                nodes: d.device_nodes().unwrap(),
                libraries: d.libraries().unwrap()
            }
        );
    }

    #[test]
    fn a_node_without_the_driver_is_an_error_naming_what_is_missing() {
        let t = tempfile::tempdir().unwrap();
        let d = driver(t.path());
        let host = t.path().join("host");
        touch(&host.join("dev/nvidia0"));
        let e = d.access(&["GPU-1"]).unwrap_err();
        assert!(e.to_string().contains("dev/nvidiactl"), "{e}");
        touch(&host.join("dev/nvidiactl"));
        let e = d.access(&["GPU-1"]).unwrap_err();
        assert!(e.to_string().contains("no libcuda.so.1"), "{e}");
        touch(&host.join("run/nvidia/driver/usr/lib64/libcuda.so.1"));
        assert!(d.access(&["GPU-1"]).is_ok());
    }

    #[test]
    fn nvidias_spec_naming_the_uuids_is_composed_in_yaml_or_json() {
        let t = tempfile::tempdir().unwrap();
        let d = driver(t.path());
        let host = t.path().join("host");
        fs::create_dir_all(host.join("etc/cdi")).unwrap();
        fs::create_dir_all(host.join("var/run/cdi")).unwrap();
        // No spec, nothing on the node: the error of the node's own files.
        assert!(d.access(&["GPU-a"]).is_err());
        fs::write(
            host.join("etc/cdi/nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    \
             deviceNodes: [{path: /dev/nvidia0}]\n- name: GPU-a\n  containerEdits:\n    deviceNodes: [{path: /dev/nvidia0}]\n",
        )
        .unwrap();
        // Another vendor's spec naming the UUID is not NVIDIA's; an unreadable file is skipped.
        fs::write(
            host.join("var/run/cdi/other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"example.com/gpu","devices":[{"name":"GPU-b"}]}"#,
        )
        .unwrap();
        fs::write(host.join("var/run/cdi/broken.yaml"), "{{{").unwrap();
        assert_eq!(
            d.access(&["GPU-a"]).unwrap(),
            GpuAccess::Nvidia(vec!["nvidia.com/gpu=GPU-a".into()])
        );
        let e = d.access(&["GPU-a", "GPU-b"]).unwrap_err();
        assert!(e.to_string().contains("GPU-b"), "{e}");
        fs::write(
            host.join("var/run/cdi/nvidia-b.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"GPU-b"}]}"#,
        )
        .unwrap();
        assert_eq!(
            d.access(&["GPU-a", "GPU-b"]).unwrap(),
            GpuAccess::Nvidia(vec!["nvidia.com/gpu=GPU-a".into(), "nvidia.com/gpu=GPU-b".into()])
        );
    }
}
