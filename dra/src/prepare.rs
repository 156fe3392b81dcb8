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
use cuquota_core::region::{
    DeviceSelector, LimitsWriter, PriorityRegion, RegionError, UsageRegion, COUNTERS_SUFFIX,
};
use cuquota_core::{Policy, PolicyKind, Priority};
use serde::{Deserialize, Serialize};

use crate::claim::{base_request, ClaimError, Grant, Grants};
use crate::gpu_access::{AccessError, DriverFiles, GpuAccess};

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
    /// Where the GPU's device nodes and driver libraries come from (NVIDIA's CDI spec, or the node's files:
    /// `gpu_access`); `None` = only `extra_mounts` and `device_nodes` (tests without a driver).
    pub driver: Option<DriverFiles>,
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

/// A `--mount` the plugin cannot add.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// Not `HOST:CONTAINER`.
    #[error("expected HOST_PATH:CONTAINER_PATH[:rw]")]
    Form,
    /// A mode other than rw or ro.
    #[error("{0:?}: expected rw or ro")]
    Mode(String),
    /// A relative path, or more fields.
    #[error("expected HOST_PATH:CONTAINER_PATH[:rw] with absolute paths")]
    Relative,
}

/// Why a claim could not be prepared or unprepared (the kubelet's answer for it).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A file or directory of the claim could not be written, read or removed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// It.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A limits, usage, priority or counters file could not be made.
    #[error("{what} file: {source}")]
    Region {
        /// `limits`, `usage`, `priority` or `counters`.
        what: &'static str,
        /// Why.
        source: RegionError,
    },
    /// The limits table refused an entry.
    #[error("{0}")]
    Limits(String),
    /// A claim or pod UID with characters a Kubernetes UID has not.
    #[error("{0:?} is not a Kubernetes UID")]
    Uid(String),
    /// The shim library is not on the node.
    #[error(
        "the cuquota library {} is missing on the node: without it the container would run without limits",
        .0.display()
    )]
    NoLibrary(PathBuf),
    /// The usage file's identity cannot be read.
    #[error("{}: its identity cannot be read", .0.display())]
    NoIdentity(PathBuf),
    /// A grant's GPU UUID does not parse.
    #[error("{0:?} is not a GPU UUID")]
    GpuUuid(String),
    /// The claim cannot be honoured.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The node cannot give the claim's containers their GPUs.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The checkpoint or CDI spec did not serialise.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// An I/O failure on `path`.
fn io_at(path: &Path) -> impl Fn(std::io::Error) -> PrepareError + Copy + '_ {
    move |source| PrepareError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A region file (`what`) that could not be made.
fn region(what: &'static str) -> impl Fn(RegionError) -> PrepareError {
    move |source| PrepareError::Region { what, source }
}

impl ExtraMount {
    /// Parses `HOST:CONTAINER[:rw|:ro]` (absolute paths).
    pub fn parse(s: &str) -> Result<ExtraMount, MountError> {
        let mut it = s.split(':');
        let (Some(h), Some(c)) = (it.next(), it.next()) else {
            return Err(MountError::Form);
        };
        let writable = match it.next() {
            None | Some("ro") => false,
            Some("rw") => true,
            Some(o) => return Err(MountError::Mode(o.to_string())),
        };
        if !h.starts_with('/') || !c.starts_with('/') || it.next().is_some() {
            return Err(MountError::Relative);
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
    /// The allocation's share ID of the device (checkpoints before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
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
    fn priority_file(&self, uid: &str, grants: &Grants) -> Result<PathBuf, PrepareError> {
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
                    .map_err(io_at(Path::new("/dev/urandom")))?;
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

    /// A claim prepared before, answered from its checkpoint: a claim's allocation cannot change while it is
    /// reserved for a pod, a re-created claim has a new UID, and a claim an earlier plugin prepared keeps the
    /// grants it was prepared with until it is unprepared. `pods`, the claim's `reservedFor` as read now (`None`:
    /// the API cannot be read), replaces the checkpoint's: a pod that joins a shared claim gets its descriptor.
    /// The CDI spec is written again (a reboot empties `/var/run/cdi`); descriptors may still be pending.
    pub fn prepared_again(
        &self,
        claim: &ClaimRef,
        pods: Option<Vec<(String, String)>>,
    ) -> Option<Result<Prepared, PrepareError>> {
        check_uid(&claim.uid).ok()?;
        let p = self.prepared(&claim.uid)?;
        if p.namespace != claim.namespace || p.name != claim.name {
            return None;
        }
        let mut again = p.clone();
        if let Some(pods) = pods {
            // A pod no longer reserved (it ended; the claim stays prepared for the others): its descriptor goes.
            for (_, gone) in p.grants.pods.iter().filter(|o| !pods.contains(o)) {
                if let Some(d) = self
                    .descriptor_path(&p.uid, gone)
                    .filter(|_| check_uid(gone).is_ok())
                {
                    if let Err(e) = remove_file(&d) {
                        return Some(Err(e));
                    }
                }
            }
            again.grants.pods = pods;
        }
        Some(self.refresh(again))
    }

    /// A checkpointed claim's CDI spec written again from the node as it is now (NVIDIA's spec or the node's
    /// own files), its answer to the kubelet recomputed (checkpoints from before subrequests were stripped and
    /// share IDs kept are answered as now) and checkpointed if it changed, and its pending descriptors written.
    fn refresh(&self, mut p: Prepared) -> Result<Prepared, PrepareError> {
        let access = self.access(&p.grants)?;
        p.devices = self.write_cdi(&p.uid, &p.grants, access.as_ref())?;
        if self.prepared(&p.uid).as_ref() != Some(&p) {
            let text = serde_json::to_vec_pretty(&p)?;
            write_atomic(&self.claim_dir(&p.uid).join("prepared.json"), &text, 0o644)?;
        }
        self.write_descriptors(&p);
        Ok(p)
    }

    /// How the claim's containers reach its GPUs (`None`: the plugin was given no driver files to look at);
    /// an error when the node lacks them.
    fn access(&self, grants: &Grants) -> Result<Option<GpuAccess>, PrepareError> {
        let Some(d) = &self.driver else {
            return Ok(None);
        };
        let per_gpu = grants.per_gpu()?;
        let uuids: Vec<&str> = per_gpu.iter().map(|g| g.uuid.as_str()).collect();
        Ok(Some(d.access(&uuids)?))
    }

    /// Prepares a claim: writes its files (again, if they were there) and returns the kubelet's devices.
    pub fn prepare(&self, claim: &ClaimRef, grants: &Grants) -> Result<Prepared, PrepareError> {
        check_uid(&claim.uid)?;
        if let Some(p) = self.prepared(&claim.uid) {
            if &p.grants == grants {
                // Idempotent: the same claim prepared again. The descriptors may still be pending.
                return self.refresh(p);
            }
        }
        if !self.library.is_file() {
            return Err(PrepareError::NoLibrary(self.library.clone()));
        }
        // Before anything is written: a node without the GPU's files refuses the claim whole.
        let access = self.access(grants)?;
        let dir = self.claim_dir(&claim.uid);
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        let marker = self.required_marker();
        if !marker.exists() {
            write_atomic(&marker, b"", 0o444)?;
        }
        if needs_priority(grants) {
            // Without the file the shim refuses a reserve's allocations and ignores the priority.
            let d = self.priority_dir();
            fs::create_dir_all(&d).map_err(io_at(&d))?;
            let p = self.priority_file(&claim.uid, grants)?;
            PriorityRegion::create(&p).map_err(region("priority"))?;
            // Its counters (launches, waits), out of the directory every container reads.
            PriorityRegion::create(&self.counters_file(&claim.uid)).map_err(region("counters"))?;
            self.link_priority(&claim.uid, &p)?;
        }
        let usage = dir.join("usage");
        let limits = dir.join("limits");
        let per_gpu = Grants {
            devices: grants.per_gpu()?,
            pods: Vec::new(),
        };
        self.write_limits(&limits, &usage, &per_gpu)?;
        let devices = self.write_cdi(&claim.uid, grants, access.as_ref())?;
        let prepared = Prepared {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            grants: grants.clone(),
            devices,
        };
        self.write_descriptors(&prepared);
        let text = serde_json::to_vec_pretty(&prepared)?;
        write_atomic(&dir.join("prepared.json"), &text, 0o644)?;
        Ok(prepared)
    }

    /// Records claim `uid`'s own priority file in its directory ([`Layout::priority_link`]).
    fn link_priority(&self, uid: &str, file: &Path) -> Result<(), PrepareError> {
        let link = self.priority_link(uid);
        let tmp = link.with_extension("tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(file, &tmp)
            .and_then(|()| fs::rename(&tmp, &link))
            .map_err(io_at(&link))
    }

    /// Writes claim `uid`'s CDI spec (a GPU it holds under several share IDs is one GPU with their sum);
    /// returns the kubelet's devices, NVIDIA's CDI devices beside the claim's own on the first.
    fn write_cdi(
        &self,
        uid: &str,
        grants: &Grants,
        access: Option<&GpuAccess>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let per_gpu = Grants {
            devices: grants.per_gpu()?,
            pods: grants.pods.clone(),
        };
        // The claim's own priority file, as its link records it (a priority directory on a tmpfs loses it at a
        // reboot: made again, empty, as at the first prepare).
        let priority = if needs_priority(grants) {
            let by_uid = [".high", ".low"]
                .iter()
                .map(|s| self.priority_dir().join(format!("{uid}{s}")))
                .find(|p| p.exists());
            let linked = fs::read_link(self.priority_link(uid)).is_ok();
            let p = match by_uid {
                // Prepared before names carried no UID (issue 35): its file is named by the UID.
                Some(p) if !linked => p,
                _ => self.priority_file(uid, grants)?,
            };
            if !p.exists() {
                let d = self.priority_dir();
                fs::create_dir_all(&d).map_err(io_at(&d))?;
                PriorityRegion::create(&p).map_err(region("priority"))?;
                if !linked {
                    self.link_priority(uid, &p)?;
                }
            }
            Some(p)
        } else {
            None
        };
        let dir = self.claim_dir(uid);
        let spec = self.cdi_spec(
            uid,
            &dir.join("limits"),
            &dir.join("usage"),
            priority.as_deref(),
            &per_gpu,
            access,
        );
        let text = serde_json::to_vec_pretty(&spec)?;
        fs::create_dir_all(&self.cdi_dir).map_err(io_at(&self.cdi_dir))?;
        write_atomic(&self.cdi_spec_path(uid), &text, 0o644)?;
        let mut devices = devices(uid, grants);
        if let (Some(GpuAccess::Nvidia(ids)), Some(first)) = (access, devices.first_mut()) {
            // NVIDIA's devices ride with the claim's own: the container that gets one gets both.
            first.cdi_device_ids.extend(ids.iter().cloned());
        }
        Ok(devices)
    }

    /// Removes everything a claim's preparation wrote; nothing to remove is success.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
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
            Err(e) => Err(io_at(&dir)(e)),
        }
    }

    /// Run at start: every checkpointed claim's CDI spec written again (a reboot empties `/var/run/cdi`; the
    /// kubelet starts a claim's containers again before or without asking to prepare it), and what no checkpoint
    /// holds removed: a claim directory without its checkpoint (a prepare that never answered the kubelet), CDI
    /// specs and descriptors of claims without one. Returns the claims kept and a line per thing done or failed.
    pub fn restore(&self) -> (Vec<Prepared>, Vec<String>) {
        let mut kept = Vec::new();
        let mut log = Vec::new();
        for e in fs::read_dir(self.state_dir.join("claims"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let uid = e.file_name().to_string_lossy().into_owned();
            if check_uid(&uid).is_err() {
                continue;
            }
            match self.prepared(&uid) {
                Some(p) => kept.push(match self.refresh(p.clone()) {
                    Ok(p) => p,
                    Err(e) => {
                        log.push(format!("claim {uid}: writing its CDI spec again: {e}"));
                        p
                    }
                }),
                None => log.push(match self.unprepare(&uid) {
                    Ok(()) => format!("claim {uid}: removed a preparation that has no checkpoint"),
                    Err(e) => format!("claim {uid}: removing a preparation that has no checkpoint: {e}"),
                }),
            }
        }
        let held = |name: &str, prefix: &str, suffix: &str| {
            let Some(rest) = name.strip_prefix(prefix).filter(|_| name.ends_with(suffix)) else {
                return true; // not ours
            };
            kept.iter().any(|p| {
                rest.strip_prefix(p.uid.as_str())
                    .is_some_and(|r| r == suffix || r.starts_with('-'))
            })
        };
        let mut dirs = vec![(self.cdi_dir.clone(), "cuquota.io-gpu-", ".json")];
        dirs.extend(self.agent_dir.clone().map(|d| (d, "dra-", ".toml")));
        for (dir, prefix, suffix) in dirs {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !held(&name, prefix, suffix) {
                    log.push(match remove_file(&e.path()) {
                        Ok(()) => format!("removed {} (no claim holds it)", e.path().display()),
                        Err(e) => e.to_string(),
                    });
                }
            }
        }
        (kept, log)
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

    fn write_limits(&self, limits: &Path, usage: &Path, grants: &Grants) -> Result<(), PrepareError> {
        let bound = UsageRegion::open_for_binding(usage, true).map_err(region("usage"))?;
        let id = bound
            .file_id()
            .ok_or_else(|| PrepareError::NoIdentity(usage.to_path_buf()))?;
        // The container's processes may run as any user.
        fs::set_permissions(usage, fs::Permissions::from_mode(0o666)).map_err(io_at(usage))?;
        let w = LimitsWriter::create(limits).map_err(region("limits"))?;
        w.update(|t| -> Result<(), PrepareError> {
            for e in t.entries.iter_mut() {
                *e = Default::default();
            }
            for g in &grants.devices {
                let uuid = parse_uuid(&g.uuid).ok_or_else(|| PrepareError::GpuUuid(g.uuid.clone()))?;
                let e = t
                    .entry_mut(DeviceSelector::Uuid(uuid))
                    .map_err(|e| PrepareError::Limits(e.to_string()))?;
                e.raw = policy(g).raw();
            }
            // Any other GPU the container can reach (device nodes every claim gets, a CUDA_VISIBLE_DEVICES of
            // the program's own): nothing, not unlimited. A GPU's UUID entry wins over `all`.
            t.entry_mut(DeviceSelector::All)
                .map_err(|e| PrepareError::Limits(e.to_string()))?
                .raw = NOT_GRANTED.raw();
            t.flags = (t.flags | LIMITS_FLAG_NO_OPT_OUT) & !LIMITS_FLAG_OPT_OUT_ALLOWED;
            t.set_usage(Some(Path::new(USAGE_IN_CONTAINER)), Some(id))
                .map_err(|e| PrepareError::Limits(e.to_string()))
        })
        .map_err(region("limits"))??;
        fs::set_permissions(limits, fs::Permissions::from_mode(0o644)).map_err(io_at(limits))?;
        Ok(())
    }

    /// The claim's CDI spec: one device named after the claim, with the GPU's nodes and driver libraries when
    /// `access` says the claim's device brings them.
    pub fn cdi_spec(
        &self,
        uid: &str,
        limits: &Path,
        usage: &Path,
        priority: Option<&Path>,
        grants: &Grants,
        access: Option<&GpuAccess>,
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
        let mut nodes: Vec<serde_json::Value> = Vec::new();
        if let Some(GpuAccess::Own { nodes: n, libraries }) = access {
            for l in libraries {
                mounts.push(ro(&l.host_path, &l.path.to_string_lossy()));
            }
            nodes.extend(
                n.iter()
                    .map(|n| serde_json::json!({"path": n.path, "hostPath": n.host_path})),
            );
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
        nodes.extend(self.device_nodes.iter().map(|p| serde_json::json!({"path": p})));
        if !nodes.is_empty() {
            edits["deviceNodes"] = nodes.into();
        }
        serde_json::json!({
            "cdiVersion": CDI_VERSION,
            "kind": CDI_KIND,
            "devices": [{"name": uid, "containerEdits": edits}],
        })
    }
}

/// The kubelet's devices, one per allocated device (a GPU held under two share IDs is two): the claim's CDI
/// device on the first, with every request's name (a container that uses any request of the claim gets the one
/// device that holds all its GPUs); the others listed without. Request names without their subrequest
/// (`req/sub` → `req`): containers name the parent request.
fn devices(uid: &str, grants: &Grants) -> Vec<PreparedDevice> {
    let mut requests: Vec<String> = Vec::new();
    for g in &grants.devices {
        let r = base_request(&g.request);
        if !requests.iter().any(|q| q == r) {
            requests.push(r.to_string());
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
                vec![base_request(&g.request).to_string()]
            },
            pool_name: g.pool.clone(),
            device_name: g.device.clone(),
            cdi_device_ids: if i == 0 {
                vec![format!("{CDI_KIND}={uid}")]
            } else {
                Vec::new()
            },
            share_id: g.share_id.clone(),
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
        memory: Some(g.memory_limit.unwrap_or(g.memory)),
        sm: g.sm,
        kind: PolicyKind::parse(&g.policy).unwrap_or(PolicyKind::Default),
        weight: g.weight,
        priority: g.priority.as_deref().and_then(Priority::parse),
        reserved_memory: g.reserved_memory,
        // The grant is the request; stored only when elastic (none = the cap, as before memoryLimit).
        memory_request: g.memory_limit.map(|_| g.memory),
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
            // The size the program is shown.
            let m = g.memory_limit.unwrap_or(g.memory);
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
fn check_uid(uid: &str) -> Result<(), PrepareError> {
    if uid.is_empty() || uid.len() > 64 || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(PrepareError::Uid(uid.to_string()));
    }
    Ok(())
}

fn remove_file(p: &Path) -> Result<(), PrepareError> {
    match fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at(p)(e)),
    }
}

/// Writes a file whole or not at all (a temporary file renamed over it).
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PrepareError> {
    let tmp = path.with_extension("tmp");
    let err = io_at(path);
    let mut f = fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}
