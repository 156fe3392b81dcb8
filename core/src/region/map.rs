//! Opening, creating and mapping region files. The only `mmap` in cuquota.
//!
//! Creation is lock-free and idempotent: whoever finds the file missing creates it (`O_EXCL`, so exactly one
//! creator sets the mode), whoever finds it empty extends it to the layout size (`ftruncate` to the same size
//! is idempotent), and whoever finds the magic zero writes the constant header (all racers write the same
//! values) and publishes the magic last. The mapping is made only after the size was checked, so a short file
//! can never make a later access fault.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::RegionError;

/// How a file is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// `PROT_READ`, file opened `O_RDONLY` (the shim's view of the limits file).
    ReadOnly,
    /// `PROT_READ | PROT_WRITE`, the file must exist.
    ReadWrite,
    /// `PROT_READ | PROT_WRITE`, created with the given mode if missing.
    Create(u32),
    /// `PROT_READ | PROT_WRITE`, never created: the file must be the one the agent bound (this identity),
    /// checked on the descriptor before anything is read or changed; then initialised like `Create`.
    Bound(FileId),
}

impl Access {
    /// Whether an empty or zeroed file is initialised (rather than refused).
    pub(crate) fn initialises(self) -> bool {
        matches!(self, Access::Create(_) | Access::Bound(_))
    }
}

/// Which file a path named when the agent bound it: device, inode and birth time. A tenant who can write a
/// directory can replace the file at a path, never give the new one the old identity: a new file gets another
/// inode, or (when the file system reuses the number of a deleted one) another birth time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`; 0 = no identity recorded.
    pub ino: u64,
    /// Birth time, ns since the epoch (`statx`'s `stx_btime`); 0 = the file system does not report one.
    pub btime_ns: u64,
}

impl FileId {
    /// An identity no file has (inode 0 is never a file's): what an unreadable binding names.
    pub const NONE: FileId = FileId {
        dev: u64::MAX,
        ino: 0,
        btime_ns: u64::MAX,
    };

    /// The identity of an open file. `statx` through the raw syscall (glibc has a wrapper only from 2.28; the
    /// library targets older ones); `fstat` where the kernel has none (birth time then unknown).
    pub fn of_fd(fd: std::os::fd::RawFd) -> std::io::Result<FileId> {
        // SAFETY: statx is plain data; all-zero is a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names `fd`; stx is a valid out-pointer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_statx,
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_INO | libc::STATX_BTIME,
                &mut stx,
            )
        };
        if r == 0 {
            let btime_ns = if stx.stx_mask & libc::STATX_BTIME != 0 {
                (stx.stx_btime.tv_sec as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(u64::from(stx.stx_btime.tv_nsec))
            } else {
                0
            };
            return Ok(FileId {
                dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
                ino: stx.stx_ino,
                btime_ns,
            });
        }
        // SAFETY: stat is plain data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open; st is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FileId {
            dev: st.st_dev,
            ino: st.st_ino,
            btime_ns: 0,
        })
    }

    /// Whether an open file is the recorded one. A recorded birth time must be matched: a file whose birth
    /// time cannot be read now (a seccomp filter that blocks `statx`) is not taken for the recorded one.
    pub fn matches(&self, now: &FileId) -> bool {
        self.dev == now.dev && self.ino == now.ino && (self.btime_ns == 0 || self.btime_ns == now.btime_ns)
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {}:{}, inode {}",
            libc::major(self.dev),
            libc::minor(self.dev),
            self.ino
        )?;
        if self.btime_ns != 0 {
            write!(
                f,
                ", born {}.{:09}",
                self.btime_ns / 1_000_000_000,
                self.btime_ns % 1_000_000_000
            )?;
        }
        Ok(())
    }
}

/// A `MAP_SHARED` mapping of a whole region file. Unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    path: PathBuf,
    /// The descriptor it was mapped from, when the caller asked to keep it (usage regions: liveness locks).
    fd: Option<std::os::fd::OwnedFd>,
    /// Set by [`Mapping::guard_truncation`]: a `SIGBUS` in the mapping is survived (fault.rs).
    guard: Option<super::fault::Guard>,
}

/// The file and its size: the bytes are shared with other processes, not this value's to print.
impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: the mapping is plain shared memory; all access to it goes through atomics (see layout.rs), which are
// safe to use from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` only hands out `&` to atomic-only structs.
unsafe impl Sync for Mapping {}

fn io_err(path: &Path, op: &'static str) -> RegionError {
    RegionError::Io {
        path: path.to_path_buf(),
        op,
        error: std::io::Error::last_os_error().to_string(),
    }
}

/// `open(path, flags, mode)` resolving no symbolic link in any component: each directory is opened with
/// `O_NOFOLLOW | O_DIRECTORY` relative to the one before (a link there fails with `ENOTDIR`), the last
/// component with `O_NOFOLLOW` (`ELOOP`). For a privileged command writing where a tenant can make links.
/// Returns the descriptor or -1 with `errno` set, like `open`.
fn open_no_symlinks(path: &Path, flags: libc::c_int, mode: u32) -> libc::c_int {
    use std::path::Component;
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let start = if path.is_absolute() { c"/" } else { c"." };
    // SAFETY: a valid NUL-terminated string.
    let mut dir = Fd(unsafe { libc::open(start.as_ptr(), dir_flags) });
    if dir.0 < 0 {
        return -1;
    }
    let parts: Vec<_> = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
        .collect();
    let Some((last, dirs)) = parts.split_last() else {
        // SAFETY: setting errno, a thread-local.
        unsafe { *libc::__errno_location() = libc::EISDIR };
        return -1;
    };
    for c in dirs {
        let Ok(name) = CString::new(c.as_os_str().as_bytes()) else {
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = libc::EINVAL };
            return -1;
        };
        // SAFETY: dir.0 is an open directory descriptor; name is NUL-terminated.
        let next = unsafe { libc::openat(dir.0, name.as_ptr(), dir_flags) };
        if next < 0 {
            return -1;
        }
        dir = Fd(next);
    }
    let Ok(name) = CString::new(last.as_os_str().as_bytes()) else {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return -1;
    };
    // SAFETY: as above; the mode is passed as the variadic argument.
    unsafe { libc::openat(dir.0, name.as_ptr(), flags | libc::O_NOFOLLOW, mode) }
}

/// Closes a descriptor on every exit path.
struct Fd(libc::c_int);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

impl Mapping {
    /// Opens (or creates) `path`, makes sure it is `size` bytes (extending an empty file when writable) and maps
    /// it. The header is validated by the caller.
    pub(crate) fn open(path: &Path, access: Access, size: usize) -> Result<Mapping, RegionError> {
        Self::open_with(path, access, size, false, false)
    }

    /// [`Mapping::open`], keeping the descriptor open ([`Mapping::fd`]); with `no_symlinks`, no component of
    /// `path` may be a symbolic link ([`RegionError::SymlinkInPath`]).
    pub(crate) fn open_keeping_fd(
        path: &Path,
        access: Access,
        size: usize,
        no_symlinks: bool,
    ) -> Result<Mapping, RegionError> {
        Self::open_with(path, access, size, true, no_symlinks)
    }

    fn open_with(
        path: &Path,
        access: Access,
        size: usize,
        keep_fd: bool,
        no_symlinks: bool,
    ) -> Result<Mapping, RegionError> {
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| RegionError::Io {
            path: path.to_path_buf(),
            op: "open",
            error: "path contains a NUL byte".into(),
        })?;
        // O_NONBLOCK: a FIFO planted at the path must not block `open` (it is then refused as not a regular
        // file); it changes nothing for regular files. O_NOFOLLOW for writable opens: a symlink planted at a
        // shared path (the default usage file lives in /tmp, mode 0666) must not make us extend or write to
        // the file it points at. Read-only opens (the agent's limits file, possibly mounted through a
        // symlink) may follow links.
        let flags = match access {
            Access::ReadOnly => libc::O_RDONLY,
            _ => libc::O_RDWR | libc::O_NOFOLLOW,
        } | libc::O_CLOEXEC
            | libc::O_NONBLOCK;
        let open = |flags: libc::c_int, mode: u32| {
            if no_symlinks {
                open_no_symlinks(path, flags, mode)
            } else {
                // SAFETY: cpath is a valid NUL-terminated string; the mode is passed as the variadic argument.
                unsafe { libc::open(cpath.as_ptr(), flags, mode) }
            }
        };
        let fd = match access {
            Access::Create(mode) => {
                let fd = open(flags | libc::O_CREAT | libc::O_EXCL, mode);
                if fd >= 0 {
                    // We created it: set the mode exactly, whatever the umask (other users of the container
                    // must be able to open a shared usage file).
                    // SAFETY: fd is a descriptor we just opened.
                    unsafe { libc::fchmod(fd, mode as libc::mode_t) };
                    fd
                } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
                    open(flags, 0)
                } else {
                    -1
                }
            }
            _ => open(flags, 0),
        };
        if fd < 0 && no_symlinks {
            let error = std::io::Error::last_os_error();
            if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                // Say which component (a diagnosis only: the open above already refused it).
                if let Some(link) = path
                    .ancestors()
                    .find(|a| a.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()))
                {
                    return Err(RegionError::SymlinkInPath {
                        path: path.to_path_buf(),
                        link: link.to_path_buf(),
                    });
                }
            }
            return Err(RegionError::Io {
                path: path.to_path_buf(),
                op: "open",
                error: error.to_string(),
            });
        }
        if fd < 0 {
            if let Access::Bound(expected) = access {
                let error = std::io::Error::last_os_error();
                if error.kind() == std::io::ErrorKind::NotFound {
                    return Err(RegionError::NotTheBoundFile {
                        path: path.to_path_buf(),
                        expected,
                        found: None,
                    });
                }
            }
            return Err(io_err(path, "open"));
        }
        let fd = Fd(fd);
        if let Access::Bound(expected) = access {
            // On the descriptor, before anything is read or written: the file we map is the file we checked.
            let found = FileId::of_fd(fd.0).map_err(|_| io_err(path, "statx"))?;
            if !expected.matches(&found) {
                return Err(RegionError::NotTheBoundFile {
                    path: path.to_path_buf(),
                    expected,
                    found: Some(found),
                });
            }
        }

        let file_size = fstat_size(&fd, path)?;
        let file_size = if file_size == 0 && access.initialises() {
            // A fresh (or concurrently created) file: every racer extends it to the same size.
            // SAFETY: fd is open for writing.
            if unsafe { libc::ftruncate(fd.0, size as libc::off_t) } != 0 {
                return Err(io_err(path, "ftruncate"));
            }
            fstat_size(&fd, path)?
        } else {
            file_size
        };
        // Opening an existing file (a reader, `cuquota status`, `limits set`) never changes it.
        if file_size == 0 {
            return Err(RegionError::NotInitialized {
                path: path.to_path_buf(),
            });
        }
        if file_size != size as u64 {
            // A region of another ABI version has another size: say which version wrote it.
            if let Some(found) = foreign_version(&fd) {
                return Err(RegionError::VersionMismatch {
                    path: path.to_path_buf(),
                    found,
                    expected: super::layout::ABI_VERSION,
                });
            }
            return Err(RegionError::BadSize {
                path: path.to_path_buf(),
                size: file_size,
                expected: size as u64,
            });
        }

        let prot = match access {
            Access::ReadOnly => libc::PROT_READ,
            _ => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: a fresh shared mapping of a file descriptor we hold, of exactly the file's size; the kernel
        // picks the address.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd.0, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io_err(path, "mmap"));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io_err(path, "mmap"))?;
        let fd = keep_fd.then(|| {
            let raw = fd.0;
            std::mem::forget(fd);
            // SAFETY: we own `raw` (opened above, not closed: its closing guard was forgotten).
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) }
        });
        Ok(Mapping {
            ptr,
            len: size,
            path: path.to_path_buf(),
            fd,
            guard: None,
        })
    }

    /// Makes a truncation of the file under this mapping survivable: the next access past the new end
    /// replaces the mapping with private zero pages instead of killing the process, and [`Mapping::is_broken`]
    /// turns true. For files other processes can truncate (the usage file).
    pub(crate) fn guard_truncation(&mut self) -> bool {
        if self.guard.is_none() {
            self.guard = super::fault::guard(self.ptr.as_ptr(), self.len);
        }
        self.guard.is_some()
    }

    /// Whether the file was truncated under this (guarded) mapping: it now holds private zero pages.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.guard.is_some_and(super::fault::is_broken)
    }

    /// The descriptor kept by [`Mapping::open_keeping_fd`].
    pub(crate) fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// The `abi_version` of a file that starts with one of our magics and another version, if it is one.
fn foreign_version(fd: &Fd) -> Option<u32> {
    let mut head = [0u8; 12];
    // SAFETY: reading into a local buffer of that size from a descriptor we hold.
    let n = unsafe { libc::pread(fd.0, head.as_mut_ptr().cast(), head.len(), 0) };
    if n != head.len() as isize {
        return None;
    }
    let magic = u64::from_ne_bytes(head[..8].try_into().ok()?);
    let version = u32::from_ne_bytes(head[8..].try_into().ok()?);
    use super::layout::{ABI_VERSION, LIMITS_MAGIC, USAGE_MAGIC};
    ((magic == LIMITS_MAGIC || magic == USAGE_MAGIC) && version != ABI_VERSION).then_some(version)
}

fn fstat_size(fd: &Fd, path: &Path) -> Result<u64, RegionError> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid out-pointer.
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(io_err(path, "fstat"));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(RegionError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    Ok(st.st_size as u64)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            super::fault::unguard(g);
        }
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows the mapping past its owner's life
        // (all references handed out are tied to `&self` of the region that owns this Mapping).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("cuquota-map-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let path = temp("fifo");
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Mapping::open(&p, Access::ReadOnly, 4096).err());
        });
        let r = rx.recv_timeout(Duration::from_secs(5));
        let _ = std::fs::remove_file(&path);
        match r {
            Ok(Some(RegionError::NotRegularFile { .. })) => {}
            Ok(other) => panic!("expected NotRegularFile, got {other:?}"),
            Err(_) => panic!("opening a FIFO blocked"),
        }
    }

    #[test]
    fn a_writable_open_does_not_follow_a_symlink() {
        let target = temp("victim");
        let link = temp("link");
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let r = Mapping::open(&link, Access::Create(0o666), 4096);
        let len = std::fs::metadata(&target).unwrap().len();
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&target);
        assert!(r.is_err(), "a symlinked region file was opened for writing");
        assert_eq!(len, 0, "the symlink's target was extended");
    }
}
