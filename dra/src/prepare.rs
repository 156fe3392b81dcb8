//! Prepare and unprepare a claim on the node: the files that put its limits in place before a container
//! starts, and the CDI device that brings them into the container.
//!
//! Per claim (UID `U`), under the state directory the plugin owns:
//! `claims/U/limits` (the limits file: one UUID entry per allocated GPU, an `all` entry that leaves any other
//! GPU nothing, the usage file bound, no opt-out),
//! `claims/U/usage` (the claim's one usage file), `claims/U/prepared.json` (the checkpoint, written last);
//! `CDI_DIR/cuquota.io-gpu-U.json` (the CDI spec, one device named `U`), and per reserved pod an agent descriptor
//! `AGENT_DIR/dra-U-POD.toml` once the pod's cgroup exists. Every write is idempotent; unprepare removes them all.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cuquota_core::config::{DEFAULT_LIMITS_PATH, DEFAULT_PRIORITY_PATH, LIMITS_REQUIRED_MARKER};
use cuquota_core::region::layout::{parse_uuid, LIMITS_FLAG_NO_OPT_OUT, LIMITS_FLAG_OPT_OUT_ALLOWED};
use cuquota_core::region::{DeviceSelector, LimitsWriter, PriorityRegion, UsageRegion, COUNTERS_SUFFIX};
use cuquota_core::{Policy, PolicyKind, Priority};
use serde::{Deserialize, Serialize};

use crate::claim::{Grant, Grants};

/// The CDI kind of the devices this plugin generates.
pub const CDI_KIND: &str = "cuquota.io/gpu";
/// The CDI version written: the newest Debian's podman 4.3 reads (containerd and CRI-O read it too).
pub const CDI_VERSION: &str = "0.5.0";
/// Where the library is mounted in the container and named in `LD_PRELOAD`.
pub const LIBRARY_IN_CONTAINER: &str = "/usr/lib/cuquota/libcuquota.so";
/// Where the claim's usage file is mounted in the container.
pub const USAGE_IN_CONTAINER: &str = "/var/run/cuquota/usage";

/// How the plugin lays out and fills a claim's files.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The plugin's state directory (`claims/`, the required marker).
    pub state_dir: PathBuf,
    /// Where CDI specs go (the runtime reads `/var/run/cdi` and `/etc/cdi`).
    pub cdi_dir: PathBuf,
    /// The agent's descriptor directory (`cuquota agent --containers`), if an agent runs.
    pub agent_dir: Option<PathBuf>,
    /// The host's `libcuquota.so`, mounted read-only into the container.
    pub library: PathBuf,
    /// The cgroup filesystem root where pods' cgroups are looked for.
    pub cgroup_root: PathBuf,
    /// The node's priority directory (docs/priority.md): a claim with a priority or reserved memory gets its own
    /// file there (`<32 random hex digits>.high` for high priority, `.low` otherwise), mounted read-write, and the directory
    /// read-only beside it; `None` = `STATE_DIR/priority`.
    pub priority_dir: Option<PathBuf>,
    /// The agent's `[enforce]` actions (`memory`, `sm`) written into descriptors.
    pub enforce_memory: String,
    /// See `enforce_memory`.
    pub enforce_sm: String,
    /// More mounts for every device: e.g. the driver libraries where no other CDI device brings them (tests:
    /// the simulator as `libcuda.so.1`).
    pub extra_mounts: Vec<ExtraMount>,
    /// More `NAME=VALUE` environment for every device.
    pub extra_env: Vec<String>,
    /// Device nodes every device needs (`/dev/nvidiactl`, …), when no other CDI device brings them.
    pub device_nodes: Vec<PathBuf>,
}

/// A mount `--mount HOST:CONTAINER[:rw]` adds to every claim's device (read-only unless `rw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMount {
    /// The host path.
    pub host: PathBuf,
    /// The path in the container.
    pub container: PathBuf,
    /// Mounted read-write.
    pub writable: bool,
}

impl ExtraMount {
    /// Parses `HOST:CONTAINER[:rw|:ro]` (absolute paths).
    pub fn parse(s: &str) -> Result<ExtraMount, String> {
        let mut it = s.split(':');
        let (Some(h), Some(c)) = (it.next(), it.next()) else {
            return Err("expected HOST_PATH:CONTAINER_PATH[:rw]".into());
        };
        let writable = match it.next() {
            None | Some("ro") => false,
            Some("rw") => true,
            Some(o) => return Err(format!("{o:?}: expected rw or ro")),
        };
        if !h.starts_with('/') || !c.starts_with('/') || it.next().is_some() {
            return Err("expected HOST_PATH:CONTAINER_PATH[:rw] with absolute paths".into());
        }
        Ok(ExtraMount {
            host: h.into(),
            container: c.into(),
            writable,
        })
    }
}

/// One device of the kubelet's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// Requests this device serves (empty = all).
    pub request_names: Vec<String>,
    /// Pool.
    pub pool_name: String,
    /// Device.
    pub device_name: String,
    /// Fully qualified CDI device ids.
    pub cdi_device_ids: Vec<String>,
}

/// The checkpoint of a prepared claim (`claims/U/prepared.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// What was granted.
    pub grants: Grants,
    /// The kubelet's answer.
    pub devices: Vec<PreparedDevice>,
}

/// The claim's identity as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl Layout {
    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.state_dir.join("claims").join(uid)
    }

    /// The CDI spec file of a claim.
    pub fn cdi_spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(format!("cuquota.io-gpu-{uid}.json"))
    }

    /// The agent descriptor of a claim's pod.
    pub fn descriptor_path(&self, uid: &str, pod_uid: &str) -> Option<PathBuf> {
        self.agent_dir
            .as_ref()
            .map(|d| d.join(format!("dra-{uid}-{pod_uid}.toml")))
    }

    /// The node's priority directory.
    pub fn priority_dir(&self) -> PathBuf {
        self.priority_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("priority"))
    }

    /// Where claim `uid`'s own priority file is recorded (a link to it in the claim's directory, host side: for
    /// unprepare and operators, `cuquota priority show claims/UID/priority`).
    pub fn priority_link(&self, uid: &str) -> PathBuf {
        self.claim_dir(uid).join("priority")
    }

    /// Claim `uid`'s priority counters file (`<priority_link>.counters`): its launch and wait counts, kept
    /// beside the link rather than in the node directory.
    fn counters_file(&self, uid: &str) -> PathBuf {
        self.claim_dir(uid).join(format!("priority{COUNTERS_SUFFIX}"))
    }

    /// Claim `uid`'s own priority file in the node directory: `.high` when any of its devices is granted high
    /// priority (the suffix is what other containers trust, and only the plugin sets it). Every container with
    /// a priority lists that directory, so the name carries no claim UID: 32 random hex digits drawn at the
    /// claim's first preparation and kept ([`Layout::priority_link`]).
    fn priority_file(&self, uid: &str, grants: &Grants) -> Result<PathBuf, String> {
        let kept = fs::read_link(self.priority_link(uid)).ok().and_then(|p| {
            let stem = p.file_stem()?.to_str()?.to_string();
            (stem.len() == 32 && stem.bytes().all(|b| b.is_ascii_hexdigit())).then_some(stem)
        });
        let stem = match kept {
            Some(s) => s,
            None => {
                let mut b = [0u8; 16];
                fs::File::open("/dev/urandom")
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
                    .map_err(|e| format!("/dev/urandom: {e}"))?;
                b.iter().map(|x| format!("{x:02x}")).collect()
            }
        };
        let high = grants
            .devices
            .iter()
            .any(|g| g.priority.as_deref().and_then(Priority::parse) == Some(Priority::High));
        Ok(self
            .priority_dir()
            .join(format!("{stem}{}", if high { ".high" } else { ".low" })))
    }

    fn required_marker(&self) -> PathBuf {
        self.state_dir.join("required")
    }

    /// The checkpoint of a prepared claim, if there is one.
    pub fn prepared(&self, uid: &str) -> Option<Prepared> {
        let text = fs::read(self.claim_dir(uid).join("prepared.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// A claim prepared before (the kubelet retries, or the plugin restarted), answered from its checkpoint
    /// without the API: a claim's allocation cannot change while it is reserved for a pod, and a re-created
    /// claim has a new UID. The descriptors may still be pending.
    pub fn prepared_again(&self, claim: &ClaimRef) -> Option<Prepared> {
        check_uid(&claim.uid).ok()?;
        let p = self.prepared(&claim.uid)?;
        if p.namespace != claim.namespace || p.name != claim.name {
            return None;
        }
        self.write_descriptors(&p);
        Some(p)
    }

    /// Prepares a claim: writes its files (again, if they were there) and returns the kubelet's devices.
    pub fn prepare(&self, claim: &ClaimRef, grants: &Grants) -> Result<Prepared, String> {
        check_uid(&claim.uid)?;
        if let Some(p) = self.prepared(&claim.uid) {
            if &p.grants == grants {
                // Idempotent: the same claim prepared again (the kubelet retries, or restarted). The descriptors
                // may still be pending.
                self.write_descriptors(&p);
                return Ok(p);
            }
        }
        if !self.library.is_file() {
            return Err(format!(
                "the cuquota library {} is missing on the node: without it the container would run without limits",
                self.library.display()
            ));
        }
        let dir = self.claim_dir(&claim.uid);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let marker = self.required_marker();
        if !marker.exists() {
            write_atomic(&marker, b"", 0o444)?;
        }
        let priority = if needs_priority(grants) {
            // Without the file the shim refuses a reserve's allocations and ignores the priority.
            let d = self.priority_dir();
            fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            let p = self.priority_file(&claim.uid, grants)?;
            PriorityRegion::create(&p).map_err(|e| format!("priority file: {e}"))?;
            // Its counters (launches, waits), out of the directory every container reads.
            PriorityRegion::create(&self.counters_file(&claim.uid))
                .map_err(|e| format!("counters file: {e}"))?;
            let link = self.priority_link(&claim.uid);
            let tmp = link.with_extension("tmp");
            let _ = fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&p, &tmp)
                .and_then(|()| fs::rename(&tmp, &link))
                .map_err(|e| format!("{}: {e}", link.display()))?;
            Some(p)
        } else {
            None
        };
        let usage = dir.join("usage");
        let limits = dir.join("limits");
        self.write_limits(&limits, &usage, grants)?;
        let spec = self.cdi_spec(&claim.uid, &limits, &usage, priority.as_deref(), grants);
        let text = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        fs::create_dir_all(&self.cdi_dir).map_err(|e| format!("{}: {e}", self.cdi_dir.display()))?;
        write_atomic(&self.cdi_spec_path(&claim.uid), &text, 0o644)?;
        let prepared = Prepared {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            grants: grants.clone(),
            devices: devices(&claim.uid, grants),
        };
        self.write_descriptors(&prepared);
        let text = serde_json::to_vec_pretty(&prepared).map_err(|e| e.to_string())?;
        write_atomic(&dir.join("prepared.json"), &text, 0o644)?;
        Ok(prepared)
    }

    /// Removes everything a claim's preparation wrote; nothing to remove is success.
    pub fn unprepare(&self, uid: &str) -> Result<(), String> {
        check_uid(uid)?;
        if let Some(dir) = &self.agent_dir {
            let prefix = format!("dra-{uid}-");
            if let Ok(rd) = fs::read_dir(dir) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        remove_file(&e.path())?;
                    }
                }
            }
        }
        remove_file(&self.cdi_spec_path(uid))?;
        // The claim's file, and one named by its UID (prepared before issue 35).
        let kept = fs::read_link(self.priority_link(uid))
            .ok()
            .and_then(|p| Some(p.file_stem()?.to_str()?.to_string()));
        for stem in kept.iter().map(String::as_str).chain([uid]) {
            for suffix in [".high", ".low"] {
                remove_file(&self.priority_dir().join(format!("{stem}{suffix}")))?;
            }
        }
        let dir = self.claim_dir(uid);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", dir.display())),
        }
    }

    /// Writes the descriptors of prepared claims whose pod's cgroup now exists (the plugin calls this every
    /// second: a claim is prepared before its pod's cgroup is made).
    pub fn resolve_pending(&self) {
        let Ok(rd) = fs::read_dir(self.state_dir.join("claims")) else {
            return;
        };
        for e in rd.flatten() {
            if let Some(p) = self.prepared(&e.file_name().to_string_lossy()) {
                self.write_descriptors(&p);
            }
        }
    }

    fn write_descriptors(&self, p: &Prepared) {
        for (pod, pod_uid) in &p.grants.pods {
            let Some(path) = self.descriptor_path(&p.uid, pod_uid) else {
                return;
            };
            if path.exists() || check_uid(pod_uid).is_err() {
                continue;
            }
            let Some(cgroup) = pod_cgroup(&self.cgroup_root, pod_uid) else {
                continue;
            };
            let dir = self.claim_dir(&p.uid);
            let text = descriptor(
                &p.namespace,
                pod,
                &dir.join("limits"),
                &dir.join("usage"),
                &cgroup,
                &self.enforce_memory,
                &self.enforce_sm,
            );
            if let Some(parent) = path.parent() {
                let _ = fs::create_dir_all(parent);
            }
            if let Err(e) = write_atomic(&path, text.as_bytes(), 0o644) {
                eprintln!("cuquota-dra-plugin: descriptor of claim {}: {e}", p.uid);
            }
        }
    }

    fn write_limits(&self, limits: &Path, usage: &Path, grants: &Grants) -> Result<(), String> {
        let region = UsageRegion::open_for_binding(usage, true).map_err(|e| format!("usage file: {e}"))?;
        let id = region
            .file_id()
            .ok_or_else(|| format!("{}: its identity cannot be read", usage.display()))?;
        // The container's processes may run as any user.
        fs::set_permissions(usage, fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("{}: {e}", usage.display()))?;
        let w = LimitsWriter::create(limits).map_err(|e| format!("limits file: {e}"))?;
        w.update(|t| -> Result<(), String> {
            for e in t.entries.iter_mut() {
                *e = Default::default();
            }
            for g in &grants.devices {
                let uuid = parse_uuid(&g.uuid).ok_or_else(|| format!("{:?} is not a GPU UUID", g.uuid))?;
                let e = t
                    .entry_mut(DeviceSelector::Uuid(uuid))
                    .map_err(|e| e.to_string())?;
                e.raw = policy(g).raw();
            }
            // Any other GPU the container can reach (device nodes every claim gets, a CUDA_VISIBLE_DEVICES of
            // the program's own): nothing, not unlimited. A GPU's UUID entry wins over `all`.
            t.entry_mut(DeviceSelector::All).map_err(|e| e.to_string())?.raw = NOT_GRANTED.raw();
            t.flags = (t.flags | LIMITS_FLAG_NO_OPT_OUT) & !LIMITS_FLAG_OPT_OUT_ALLOWED;
            t.set_usage(Some(Path::new(USAGE_IN_CONTAINER)), Some(id))
        })
        .map_err(|e| format!("limits file: {e}"))??;
        fs::set_permissions(limits, fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("{}: {e}", limits.display()))?;
        Ok(())
    }

    /// The claim's CDI spec: one device named after the claim.
    pub fn cdi_spec(
        &self,
        uid: &str,
        limits: &Path,
        usage: &Path,
        priority: Option<&Path>,
        grants: &Grants,
    ) -> serde_json::Value {
        let mount = |h: &Path, c: &str, rw: bool| {
            let mode = if rw { "rw" } else { "ro" };
            serde_json::json!({"hostPath": h, "containerPath": c, "options": [mode, "nosuid", "nodev", "bind"]})
        };
        let ro = |h: &Path, c: &str| mount(h, c, false);
        let mut mounts = vec![
            ro(&self.library, LIBRARY_IN_CONTAINER),
            ro(limits, DEFAULT_LIMITS_PATH),
            ro(&self.required_marker(), LIMITS_REQUIRED_MARKER),
            mount(usage, USAGE_IN_CONTAINER, true),
        ];
        if let Some(own) = priority {
            // Its own file read-write; everyone's, the node directory, read-only at the path + ".d".
            mounts.push(mount(own, DEFAULT_PRIORITY_PATH, true));
            mounts.push(mount(
                &self.counters_file(uid),
                &format!("{DEFAULT_PRIORITY_PATH}{COUNTERS_SUFFIX}"),
                true,
            ));
            let dir = format!("{DEFAULT_PRIORITY_PATH}.d");
            mounts.push(mount(&self.priority_dir(), &dir, false));
        }
        for m in &self.extra_mounts {
            mounts.push(mount(&m.host, &m.container.to_string_lossy(), m.writable));
        }
        let mut env = vec![
            format!("LD_PRELOAD={LIBRARY_IN_CONTAINER}"),
            format!("CUQUOTA_USAGE_FILE={USAGE_IN_CONTAINER}"),
            format!(
                "CUDA_VISIBLE_DEVICES={}",
                grants
                    .devices
                    .iter()
                    .map(|g| g.uuid.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ];
        env.extend(hami_env(grants));
        env.extend(self.extra_env.iter().cloned());
        let mut edits = serde_json::json!({"env": env, "mounts": mounts});
        if !self.device_nodes.is_empty() {
            edits["deviceNodes"] = self
                .device_nodes
                .iter()
                .map(|p| serde_json::json!({"path": p}))
                .collect();
        }
        serde_json::json!({
            "cdiVersion": CDI_VERSION,
            "kind": CDI_KIND,
            "devices": [{"name": uid, "containerEdits": edits}],
        })
    }
}

/// The kubelet's devices: the claim's CDI device on the first, with every request's name (a container that
/// uses any request of the claim gets the one device that holds all its GPUs); the others listed without.
fn devices(uid: &str, grants: &Grants) -> Vec<PreparedDevice> {
    let mut requests: Vec<String> = Vec::new();
    for g in &grants.devices {
        if !requests.contains(&g.request) {
            requests.push(g.request.clone());
        }
    }
    grants
        .devices
        .iter()
        .enumerate()
        .map(|(i, g)| PreparedDevice {
            request_names: if i == 0 {
                requests.clone()
            } else {
                vec![g.request.clone()]
            },
            pool_name: g.pool.clone(),
            device_name: g.device.clone(),
            cdi_device_ids: if i == 0 {
                vec![format!("{CDI_KIND}={uid}")]
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// Whether a claim takes part in priority coordination (docs/priority.md).
fn needs_priority(grants: &Grants) -> bool {
    grants
        .devices
        .iter()
        .any(|g| g.priority.is_some() || g.reserved_memory.is_some())
}

/// The limits-file policy of a GPU the claim was not granted: 1 byte (no context fits), 1 % hard.
pub const NOT_GRANTED: Policy = Policy {
    memory: Some(1),
    sm: Some(1),
    kind: PolicyKind::Hard,
    ..Policy::NONE
};

/// The limits-file policy of a grant.
fn policy(g: &Grant) -> Policy {
    Policy {
        memory: Some(g.memory),
        sm: g.sm,
        kind: PolicyKind::parse(&g.policy).unwrap_or(PolicyKind::Default),
        weight: g.weight,
        priority: g.priority.as_deref().and_then(Priority::parse),
        reserved_memory: g.reserved_memory,
    }
}

/// The environment HAMi-compatible programs read for the granted limits (CUDA ordinal i = i-th UUID in
/// `CUDA_VISIBLE_DEVICES`).
fn hami_env(grants: &Grants) -> Vec<String> {
    let mut env: Vec<String> = grants
        .devices
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let m = g.memory;
            let v = if m.is_multiple_of(1 << 20) {
                format!("{}m", m >> 20)
            } else {
                m.to_string()
            };
            format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={v}")
        })
        .collect();
    let sms: Vec<Option<u32>> = grants.devices.iter().map(|g| g.sm).collect();
    if sms.iter().all(|s| *s == sms[0]) {
        if let Some(s) = sms[0] {
            env.push(format!("CUDA_DEVICE_SM_LIMIT={s}"));
        }
    } else {
        for (i, s) in sms.iter().enumerate() {
            env.push(format!("CUDA_DEVICE_SM_LIMIT_{i}={}", s.unwrap_or(0)));
        }
    }
    env
}

/// The pod's cgroup directory as the kubelet makes it (cgroupfs or systemd driver; v2, or v1's hierarchies),
/// if it exists.
pub fn pod_cgroup(root: &Path, pod_uid: &str) -> Option<PathBuf> {
    let under = pod_uid.replace('-', "_");
    let rel = [
        format!("kubepods/pod{pod_uid}"),
        format!("kubepods/burstable/pod{pod_uid}"),
        format!("kubepods/besteffort/pod{pod_uid}"),
        format!("kubepods.slice/kubepods-pod{under}.slice"),
        format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice"),
        format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice"),
    ];
    ["", "unified", "memory", "pids", "cpu,cpuacct"]
        .iter()
        .flat_map(|h| rel.iter().map(move |r| root.join(h).join(r)))
        .find(|p| p.is_dir())
}

/// An agent descriptor (docs/agent.md).
fn descriptor(
    namespace: &str,
    pod: &str,
    limits: &Path,
    usage: &Path,
    cgroup: &Path,
    memory: &str,
    sm: &str,
) -> String {
    #[derive(Serialize)]
    struct Members<'a> {
        cgroup: &'a Path,
    }
    #[derive(Serialize)]
    struct Enforce<'a> {
        memory: &'a str,
        sm: &'a str,
    }
    #[derive(Serialize)]
    struct Descriptor<'a> {
        namespace: &'a str,
        pod: &'a str,
        limits: &'a Path,
        usage: &'a Path,
        members: Members<'a>,
        enforce: Enforce<'a>,
    }
    let d = Descriptor {
        namespace,
        pod,
        limits,
        usage,
        members: Members { cgroup },
        enforce: Enforce { memory, sm },
    };
    format!(
        "# Written by cuquota-dra-plugin for a ResourceClaim; removed when the claim is unprepared.\n{}",
        toml::to_string(&d).unwrap_or_default()
    )
}

/// A claim UID names files: only a Kubernetes UID's characters.
fn check_uid(uid: &str) -> Result<(), String> {
    if uid.is_empty() || uid.len() > 64 || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(format!("{uid:?} is not a Kubernetes UID"));
    }
    Ok(())
}

fn remove_file(p: &Path) -> Result<(), String> {
    match fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// Writes a file whole or not at all (a temporary file renamed over it).
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}
