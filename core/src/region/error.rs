//! [`RegionError`]: why a region file cannot be used.

use std::fmt;
use std::path::PathBuf;

/// A region file that cannot be opened, created or used. Messages name the file and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// An OS call failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`open`, `mmap`, …).
        op: &'static str,
        /// The OS error text.
        error: String,
    },
    /// The path is not a regular file.
    NotRegularFile {
        /// The file.
        path: PathBuf,
    },
    /// The file size is not the size this version's layout needs.
    BadSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The size expected.
        expected: u64,
    },
    /// The file does not start with the expected magic (not a cuquota region of this kind).
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic found.
        found: u64,
        /// The magic expected.
        expected: u64,
    },
    /// The file was written by an incompatible version.
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// Its `abi_version`.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// A header field disagrees with our layout.
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// The header field.
        field: &'static str,
        /// Its value.
        found: u64,
        /// Ours.
        expected: u64,
    },
    /// A read-only open found a file nobody has initialised yet.
    NotInitialized {
        /// The file.
        path: PathBuf,
    },
    /// All process slots are live.
    SlotsExhausted {
        /// The file.
        path: PathBuf,
        /// Slot count.
        max: usize,
    },
    /// All device entries are taken by other UUIDs.
    DevicesExhausted {
        /// The file.
        path: PathBuf,
        /// Entry count.
        max: usize,
    },
    /// A device entry stayed "being claimed" by a live process for too long.
    DeviceClaimBusy {
        /// The file.
        path: PathBuf,
        /// The claimer.
        pid: u32,
    },
    /// A member list longer than the limits file holds.
    TooManyMembers {
        /// The file.
        path: PathBuf,
        /// Distinct pids given.
        count: usize,
        /// What the file holds.
        max: usize,
    },
    /// A member pid that names no process (0).
    InvalidMember {
        /// The file.
        path: PathBuf,
        /// The pid.
        pid: u32,
    },
    /// The limits file has a write in progress (and never had a consistent state we could read), or a live
    /// writer holds it for too long.
    LimitsBusy {
        /// The file.
        path: PathBuf,
        /// The writer's pid (0 = unknown).
        writer_pid: u32,
    },
    /// The usage file was truncated or zeroed while this process had it mapped (by another process of the
    /// container): what it shares can no longer be trusted.
    Broken {
        /// The file.
        path: PathBuf,
        /// What happened to it: `truncated`, `zeroed`.
        what: &'static str,
    },
    /// The agent's limits file now binds the container to another usage file than the one this process
    /// accounts in.
    Superseded {
        /// The file this process accounts in.
        path: PathBuf,
    },
    /// A command that resolves no symbolic link (binding a usage file as root) found one in the path.
    SymlinkInPath {
        /// The path given.
        path: PathBuf,
        /// Its component that is a symbolic link.
        link: PathBuf,
    },
    /// The agent bound the container to a usage file and the file at its path is another one (or none): it
    /// was renamed away, deleted or replaced after it was bound.
    NotTheBoundFile {
        /// The bound path.
        path: PathBuf,
        /// The identity the agent recorded.
        expected: super::FileId,
        /// The file found there (`None`: none).
        found: Option<super::FileId>,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io { path, op, error } => write!(f, "{}: {op} failed: {error}", path.display()),
            RegionError::NotRegularFile { path } => write!(f, "{}: not a regular file", path.display()),
            RegionError::SymlinkInPath { path, link } => write!(
                f,
                "{}: {} is a symbolic link, and binding follows none (it runs privileged, and a tenant who \
                 can write the directory could point it anywhere): give the path without links",
                path.display(),
                link.display()
            ),
            RegionError::BadSize { path, size, expected } => write!(
                f,
                "{}: size {size} bytes, expected {expected}: not a region of this cuquota version \
                 (remove it or point the variable elsewhere)",
                path.display()
            ),
            RegionError::BadMagic { path, found, expected } => write!(
                f,
                "{}: bad magic {found:#018x} (expected {expected:#018x}): not a cuquota region of this kind",
                path.display()
            ),
            RegionError::VersionMismatch { path, found, expected } => write!(
                f,
                "{}: region ABI version {found}, this cuquota speaks {expected}: upgrade the agent and the \
                 library together, or recreate the file",
                path.display()
            ),
            RegionError::LayoutMismatch { path, field, found, expected } => write!(
                f,
                "{}: header field {field} = {found}, expected {expected}: incompatible region layout",
                path.display()
            ),
            RegionError::NotInitialized { path } => {
                write!(f, "{}: region not initialised (create it with `cuquota limits init`)", path.display())
            }
            RegionError::SlotsExhausted { path, max } => {
                write!(f, "{}: all {max} process slots are in use by live processes", path.display())
            }
            RegionError::DevicesExhausted { path, max } => {
                write!(f, "{}: all {max} device entries are in use by other GPUs", path.display())
            }
            RegionError::DeviceClaimBusy { path, pid } => write!(
                f,
                "{}: a device entry has been half-claimed by live pid {pid} for too long (is it stopped?)",
                path.display()
            ),
            RegionError::TooManyMembers { path, count, max } => write!(
                f,
                "{}: {count} member pids given, the limits file holds at most {max}",
                path.display()
            ),
            RegionError::InvalidMember { path, pid } => {
                write!(f, "{}: member pid {pid} names no process", path.display())
            }
            RegionError::LimitsBusy { path, writer_pid } => write!(
                f,
                "{}: limits are being written (writer pid {writer_pid}) and no consistent copy could be read; \
                 retry, or rerun the agent's write",
                path.display()
            ),
            RegionError::Broken { path, what } => write!(
                f,
                "{}: the usage file was {what} while this process used it (by another process of the \
                 container): the container's accounting is lost, so new allocations are refused",
                path.display()
            ),
            RegionError::Superseded { path } => write!(
                f,
                "{}: the agent's limits file binds the container to another usage file now: what this process \
                 would charge here the container's other processes no longer see, so new allocations are \
                 refused (what it holds is kept); restart the process to account in the bound file",
                path.display()
            ),
            RegionError::NotTheBoundFile { path, expected, found } => {
                write!(f, "{}: not the usage file the agent bound ({expected}); ", path.display())?;
                match found {
                    Some(id) => write!(f, "this one is {id}")?,
                    None => f.write_str("there is no file there")?,
                }
                write!(
                    f,
                    ": it was renamed, deleted or replaced since it was bound, and a fresh file would be a fresh \
                     cap, so this process is refused. The node's administrator re-binds the container's file with \
                     `cuquota limits set LIMITS --device all --usage {} [--usage-host HOST_PATH]`",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for RegionError {}
