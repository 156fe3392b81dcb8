//! Which host processes belong to a container, from facts the tenant cannot rewrite:
//! - `cgroup`: the pids in the cgroup directory's `cgroup.procs` and in every sub-cgroup's (v1 or v2);
//! - `pidns`: every process whose pid namespace is that one, or nested in it (NS_GET_PARENT);
//! - `subtree`: the process and all its descendants (by parent pid). Meant for a child subreaper such as
//!   `cuquota run`, whose orphaned descendants are re-parented to it and so never leave the tree. The root is
//!   the process with the pid *and* the start time (`/proc/<pid>/stat` field 22, clock ticks after boot) the
//!   descriptor's writer recorded: a process at that pid with any other start time is not the root, whenever
//!   the agent first sees it (never a wall-clock mtime against the boot clock). Without a recorded start time
//!   no process is the root (members unknown: fail closed).
//!   The members of the last pass are remembered too: once the root is gone (exited, killed, its pid reused)
//!   those still alive (same pid and start time) and their descendants stay the container until none is
//!   left; only then are the members unknown (an error).
//!
//! The agent reads `/proc` once per pass ([`ProcTable`]) and shares it among containers.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How a container's processes are found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberSource {
    /// A cgroup directory (and its sub-cgroups).
    Cgroup(PathBuf),
    /// A pid namespace, named by a path such as `/proc/<pid>/ns/pid` or a bind mount of one.
    PidNs(PathBuf),
    /// A process and its descendants: the root's pid and its start time (clock ticks after boot) as the
    /// descriptor's writer recorded it; `None` (an older descriptor) confirms no process as the root.
    Subtree {
        /// The root's pid.
        root: u32,
        /// The root's `/proc/<pid>/stat` start time (field 22).
        start: Option<u64>,
    },
}

/// How the report names a member source.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SourceReport {
    /// `cgroup`, `pidns` or `subtree`.
    pub kind: &'static str,
    /// The directory, the namespace path, or the root pid.
    pub value: String,
}

impl MemberSource {
    /// For the report.
    pub fn report(&self) -> SourceReport {
        let (kind, value) = match self {
            MemberSource::Cgroup(p) => ("cgroup", p.display().to_string()),
            MemberSource::PidNs(p) => ("pidns", p.display().to_string()),
            MemberSource::Subtree { root, .. } => ("subtree", root.to_string()),
        };
        SourceReport { kind, value }
    }
}

/// One process seen in `/proc`.
#[derive(Clone, Copy, Debug)]
pub struct ProcEntry {
    /// Parent pid.
    pub ppid: u32,
    /// Start time (clock ticks after boot): tells a reused pid from the original.
    pub start_time: u64,
    /// State letter (`/proc/<pid>/stat` field 3: R, S, D, T, Z, …).
    pub state: u8,
}

impl ProcEntry {
    /// `/proc/<pid>/stat` of one process; `None` when it is gone (or `/proc` is unavailable).
    pub fn read(pid: u32) -> Option<ProcEntry> {
        Self::of(&procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?)
    }

    fn of(p: &procfs::process::Process) -> Option<ProcEntry> {
        let st = p.stat().ok()?;
        Some(ProcEntry {
            ppid: u32::try_from(st.ppid).unwrap_or(0),
            start_time: st.starttime,
            state: u8::try_from(st.state).unwrap_or(b'?'),
        })
    }
}

/// A snapshot of the host's processes.
#[derive(Debug, Default)]
pub struct ProcTable {
    /// pid → entry.
    pub procs: BTreeMap<u32, ProcEntry>,
    children: BTreeMap<u32, Vec<u32>>,
}

impl ProcTable {
    /// Reads `/proc`.
    pub fn read() -> ProcTable {
        let mut t = ProcTable::default();
        for p in procfs::process::all_processes().into_iter().flatten().flatten() {
            // A process that exits meanwhile is simply not in the table.
            if let (Ok(pid), Some(e)) = (u32::try_from(p.pid), ProcEntry::of(&p)) {
                t.insert(pid, e);
            }
        }
        t
    }

    /// Adds a process (tests build tables by hand).
    pub fn insert(&mut self, pid: u32, e: ProcEntry) {
        self.procs.insert(pid, e);
        self.children.entry(e.ppid).or_default().push(pid);
    }

    /// `root` and all its descendants present in the table.
    pub fn subtree(&self, root: u32) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            if out.insert(p) {
                todo.extend(self.children.get(&p).into_iter().flatten().copied());
            }
        }
        out
    }
}

/// What the agent remembers between passes for member discovery: the members (pid, start time) each subtree
/// (root pid, root start time) had at the last pass.
#[derive(Debug, Default)]
pub struct MemberState {
    trees: BTreeMap<(u32, u64), Vec<(u32, u64)>>,
}

/// Why a container's members are unknown this pass.
#[derive(Debug, thiserror::Error)]
pub enum MembersError {
    /// A cgroup or namespace file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The subtree root's pid now holds another process.
    #[error(
        "subtree root {root} is another process (start time {found} ticks, the descriptor records \
         subtree_start = {recorded}): its pid was reused; members unknown"
    )]
    RootReused {
        /// The root's pid.
        root: u32,
        /// The start time of the process at that pid.
        found: u64,
        /// The descriptor's `subtree_start`.
        recorded: u64,
    },
    /// The descriptor has no `subtree_start` to confirm the root by.
    #[error(
        "subtree root {root}: the descriptor records no subtree_start (the root's start time, \
         /proc/{root}/stat field 22), so the process at that pid cannot be confirmed as the root: members unknown"
    )]
    NoStartTime {
        /// The root's pid.
        root: u32,
    },
    /// The root and every process of its tree are gone.
    #[error("subtree root {root} is not running")]
    RootGone {
        /// The root's pid.
        root: u32,
    },
}

/// A read of `path` that failed.
fn unreadable(path: &Path) -> impl FnOnce(std::io::Error) -> MembersError + '_ {
    move |source| MembersError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// The pids in `dir/cgroup.procs` and in every sub-cgroup's.
pub fn cgroup_pids(dir: &Path) -> Result<BTreeSet<u32>, MembersError> {
    let procs = dir.join("cgroup.procs");
    let text = std::fs::read_to_string(&procs).map_err(unreadable(&procs))?;
    let mut out: BTreeSet<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let rd = std::fs::read_dir(dir).map_err(unreadable(dir))?;
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            // A sub-cgroup that vanished meanwhile has no processes left: not an error.
            match cgroup_pids(&e.path()) {
                Ok(sub) => out.extend(sub),
                Err(_) if !e.path().exists() => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(out)
}

/// `NS_GET_PARENT` (linux/nsfs.h: `_IO(0xb7, 0x2)`).
const NS_GET_PARENT: libc::c_ulong = 0xb702;

/// Whether the namespace open as `fd` is `target` (device, inode) or nested in it; consumes `fd`.
fn ns_within(fd: std::fs::File, target: (u64, u64)) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut cur = fd;
    for _ in 0..33 {
        let Ok(m) = cur.metadata() else { return false };
        if (m.dev(), m.ino()) == target {
            return true;
        }
        // SAFETY: an ioctl on an open nsfs descriptor; on success it returns a new descriptor we own.
        let parent = unsafe { libc::ioctl(cur.as_raw_fd(), NS_GET_PARENT as _) };
        if parent < 0 {
            return false; // the initial namespace, or one outside ours (EPERM)
        }
        // SAFETY: `parent` is a fresh descriptor owned by nobody else.
        cur = unsafe { std::fs::File::from_raw_fd(parent) };
    }
    false
}

/// Every process in `table` whose pid namespace is `ns` (a path to a pid-namespace file) or nested in it.
pub fn pidns_pids(ns: &Path, table: &ProcTable) -> Result<BTreeSet<u32>, MembersError> {
    let m = std::fs::metadata(ns).map_err(unreadable(ns))?;
    let target = (m.dev(), m.ino());
    let mut out = BTreeSet::new();
    for &pid in table.procs.keys() {
        if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/ns/pid")) {
            if ns_within(f, target) {
                out.insert(pid);
            }
        }
    }
    Ok(out)
}

impl MemberSource {
    /// The container's host pids now. `key` identifies the container for what is remembered between passes.
    pub fn discover(
        &self,
        table: &ProcTable,
        state: &mut MemberState,
    ) -> Result<BTreeSet<u32>, MembersError> {
        match self {
            MemberSource::Cgroup(dir) => cgroup_pids(dir),
            MemberSource::PidNs(ns) => pidns_pids(ns, table),
            MemberSource::Subtree { root, start } => {
                // A zombie root has exited (its parent has not reaped it yet).
                let live = table.procs.get(root).filter(|e| e.state != b'Z');
                let why = match (live, start) {
                    (Some(e), Some(t)) if e.start_time == *t => {
                        let members = table.subtree(*root);
                        state.trees.insert((*root, *t), remember(&members, table));
                        return Ok(members);
                    }
                    (Some(e), Some(t)) => MembersError::RootReused {
                        root: *root,
                        found: e.start_time,
                        recorded: *t,
                    },
                    (Some(_), None) => MembersError::NoStartTime { root: *root },
                    (None, _) => MembersError::RootGone { root: *root },
                };
                // The root is gone: its tree stays the container while any process of it lives (the same
                // pid and start time), with whatever those processes start.
                let Some(key) = start.map(|t| (*root, t)) else {
                    return Err(why);
                };
                let survivors: Vec<u32> = state
                    .trees
                    .get(&key)
                    .into_iter()
                    .flatten()
                    .filter(|(p, t)| {
                        table
                            .procs
                            .get(p)
                            .is_some_and(|e| e.start_time == *t && e.state != b'Z')
                    })
                    .map(|(p, _)| *p)
                    .collect();
                if survivors.is_empty() {
                    state.trees.remove(&key);
                    return Err(why);
                }
                let members: BTreeSet<u32> = survivors.iter().flat_map(|&p| table.subtree(p)).collect();
                state.trees.insert(key, remember(&members, table));
                Ok(members)
            }
        }
    }
}

/// `pids` with their start times, to tell them from later processes that reuse a pid.
fn remember(pids: &BTreeSet<u32>, table: &ProcTable) -> Vec<(u32, u64)> {
    pids.iter()
        .filter_map(|p| Some((*p, table.procs.get(p)?.start_time)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(edges: &[(u32, u32, u64)]) -> ProcTable {
        let mut t = ProcTable::default();
        for &(pid, ppid, start_time) in edges {
            t.insert(
                pid,
                ProcEntry {
                    ppid,
                    start_time,
                    state: b'S',
                },
            );
        }
        t
    }

    fn subtree(root: u32, start: u64) -> MemberSource {
        MemberSource::Subtree {
            root,
            start: Some(start),
        }
    }

    #[test]
    fn subtree_is_the_root_and_its_descendants() {
        let t = table(&[
            (1, 0, 1),
            (10, 1, 5),
            (11, 10, 6),
            (12, 11, 7),
            (20, 1, 8),
            (13, 10, 9),
        ]);
        let mut st = MemberState::default();
        let got = subtree(10, 5).discover(&t, &mut st).unwrap();
        assert_eq!(got, [10, 11, 12, 13].into_iter().collect());
        // The root's pid reused by another process: not its tree.
        let t2 = table(&[(1, 0, 1), (10, 1, 99), (14, 10, 100)]);
        let e = subtree(10, 5).discover(&t2, &mut st).unwrap_err();
        assert!(e.to_string().contains("another process"), "{e}");
        let e = subtree(77, 5).discover(&t, &mut st).unwrap_err();
        assert!(e.to_string().contains("not running"), "{e}");
        // The root exits, leaving a process of its tree behind (re-parented to init): it stays a member, with
        // what it starts, until it is gone; a newcomer reusing the root's pid does not join.
        let src = subtree(10, 5);
        let mut ms = MemberState::default();
        src.discover(&t, &mut ms).unwrap();
        let t4 = table(&[(1, 0, 1), (12, 1, 7), (15, 12, 20), (10, 1, 30), (20, 1, 8)]);
        let got = src.discover(&t4, &mut ms).unwrap();
        assert_eq!(got, [12, 15].into_iter().collect());
        let t5 = table(&[(1, 0, 1), (15, 1, 20), (16, 15, 21)]);
        assert_eq!(
            src.discover(&t5, &mut ms).unwrap(),
            [15, 16].into_iter().collect()
        );
        let t6 = table(&[(1, 0, 1), (15, 1, 99)]);
        let e = src.discover(&t6, &mut ms).unwrap_err();
        assert!(
            e.to_string().contains("not running"),
            "the whole tree is gone (15 is another process): {e}"
        );
        // Once the whole tree is gone, a stranger that reuses the root's pid is not taken as the root.
        let t7 = table(&[(1, 0, 1), (10, 1, 40), (41, 10, 41)]);
        let e = src.discover(&t7, &mut ms).unwrap_err();
        assert!(
            e.to_string().contains("another process"),
            "a stranger at the root's pid: {e}"
        );
        let mut t3 = table(&[(1, 0, 1), (10, 1, 5)]);
        t3.procs.get_mut(&10).unwrap().state = b'Z';
        let e = src.discover(&t3, &mut st).unwrap_err();
        assert!(
            e.to_string().contains("not running"),
            "a zombie root has exited: {e}"
        );
    }

    /// After an agent restart (nothing remembered) the root is known by the start time its descriptor
    /// recorded, on both sides by one tick, whatever the clocks: no wall clock is involved.
    #[test]
    fn a_fresh_agent_knows_the_root_only_by_its_recorded_start() {
        let t = table(&[(1, 0, 1), (10, 1, 40), (41, 10, 41)]);
        for recorded in [39, 41, 0, u64::MAX] {
            let e = subtree(10, recorded)
                .discover(&t, &mut MemberState::default())
                .unwrap_err();
            assert!(
                e.to_string().contains("another process") && e.to_string().contains("40"),
                "{e}"
            );
        }
        assert_eq!(
            subtree(10, 40).discover(&t, &mut MemberState::default()).unwrap(),
            [10, 41].into_iter().collect()
        );
        // An older descriptor without subtree_start: no process is confirmed as the root.
        let old = MemberSource::Subtree {
            root: 10,
            start: None,
        };
        let e = old.discover(&t, &mut MemberState::default()).unwrap_err();
        assert!(e.to_string().contains("no subtree_start"), "{e}");
    }

    #[test]
    fn the_live_process_table_has_us_and_our_parent() {
        let t = ProcTable::read();
        let me = std::process::id();
        let e = t.procs.get(&me).expect("this process");
        assert!(t.subtree(e.ppid).contains(&me));
    }

    #[test]
    fn cgroup_members_include_sub_cgroups() {
        let dir = std::env::temp_dir().join(format!("cuquota-cgroup-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::create_dir_all(dir.join("c")).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "5\n6\n").unwrap();
        std::fs::write(dir.join("a/cgroup.procs"), "").unwrap();
        std::fs::write(dir.join("a/b/cgroup.procs"), "7\n").unwrap();
        std::fs::write(dir.join("c/cgroup.procs"), "8\n").unwrap();
        assert_eq!(cgroup_pids(&dir).unwrap(), [5, 6, 7, 8].into_iter().collect());
        assert_eq!(cgroup_pids(&dir.join("a")).unwrap(), [7].into_iter().collect());
        assert!(cgroup_pids(&dir.join("missing"))
            .unwrap_err()
            .to_string()
            .contains("missing"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// This process's own cgroup (from /proc/self/cgroup) lists it.
    #[test]
    fn our_own_cgroup_lists_us() {
        let groups = procfs::process::Process::myself().unwrap().cgroups().unwrap();
        let me = std::process::id();
        let mut tried = Vec::new();
        for g in &groups {
            let rel = g.pathname.trim_start_matches('/');
            let ctrl = g.controllers.join(",");
            let dirs: Vec<PathBuf> = if ctrl.is_empty() {
                vec![
                    Path::new("/sys/fs/cgroup").join(rel),
                    Path::new("/sys/fs/cgroup/unified").join(rel),
                ]
            } else {
                let c = ctrl.trim_start_matches("name=");
                vec![Path::new("/sys/fs/cgroup").join(c).join(rel)]
            };
            for d in dirs.into_iter().filter(|d| d.join("cgroup.procs").is_file()) {
                tried.push(d.clone());
                let pids = cgroup_pids(&d).unwrap();
                assert!(pids.contains(&me), "{} does not list {me}", d.display());
            }
        }
        assert!(
            !tried.is_empty(),
            "no cgroup directory of this process found under /sys/fs/cgroup: {groups:?}"
        );
    }

    #[test]
    fn our_pid_namespace_holds_us_and_our_children() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let t = ProcTable::read();
        let pids = pidns_pids(Path::new("/proc/self/ns/pid"), &t).unwrap();
        assert!(pids.contains(&std::process::id()));
        assert!(pids.contains(&child.id()));
        let _ = child.kill();
        let _ = child.wait();
        assert!(pidns_pids(Path::new("/proc/999999999/ns/pid"), &t).is_err());
    }
}
