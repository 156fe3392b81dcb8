//! Memory this process shares with other processes through CUDA IPC (`cuIpcGetMemHandle` /
//! `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle`) and shareable VMM handles (`cuMemExportToShareableHandle` /
//! `cuMemImportFromShareableHandle`, POSIX file descriptors, keyed by the descriptor's open file). cuda.h calls the exporter's `cuMemFree` before the importers
//! close undefined; a driver that counts references keeps the memory, so its charge must not go with the free.
//! An exported allocation's charge lives in the container's shared table (usage region, keyed by a hash of
//! the handle's bytes, which both processes see) until its last holder lets go; an import whose key is not in
//! this container's table (another container exported it) is charged to this process while it holds it.
//! Not on the allocation path: one mutex, never held across a driver call. [`Shared`] is the family: its
//! table is private, `Memory` (`interprocess`, `charge`, `vmm_ops`) holds it and asks through its methods.

use crate::locks::{hold_all, release_all, Lock, Side};
use cuquota_core::DeviceId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// What an open import holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// A hold on this container's shared entry.
    Shared {
        /// Entry index.
        entry: usize,
        /// The handle's key.
        key: u64,
    },
    /// Charged to this process (another container's export).
    Charged {
        /// Device entry charged.
        dev: DeviceId,
        /// Bytes charged.
        bytes: u64,
    },
}

/// An exported allocation: its shared entry, its key, and whether this process's charge moved there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Export {
    /// Shared entry index.
    pub(super) entry: usize,
    /// The handle's key.
    pub(super) key: u64,
    /// This process's charge moved into the entry (else it stayed on the process).
    pub(super) moved: bool,
}

/// What a `cuIpcCloseMemHandle` did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// Not an address this process opened (the driver answered).
    Unknown,
    /// Opened more than once: one reference fewer.
    StillOpen,
    /// The last reference: its hold goes.
    Last(Hold),
}

#[derive(Default)]
struct Table {
    exports: HashMap<u64, Export>,
    /// Device pointer → (hold, opens).
    imports: HashMap<u64, (Hold, u32)>,
    /// Exported VMM handles (`cuMemExportToShareableHandle`) → their export.
    vmm_exports: HashMap<u64, Export>,
    /// Imported VMM handles (`cuMemImportFromShareableHandle`) → their hold (`None`: another container's,
    /// nothing charged until it is mapped).
    vmm_imports: HashMap<u64, Option<Hold>>,
    /// Exports this process let go of that others may still hold: (entry, key, bytes, device entry). The driver
    /// may go on counting such memory as this process's (the simulator does, as a driver that counts
    /// references), and what NVML says this process holds must not be taken for its overhead.
    lingering: Vec<(usize, u64, u64, DeviceId)>,
}

/// The process's exports and imports (the family's state: private, behind the methods below).
#[derive(Default)]
pub(super) struct Shared {
    table: Lock<Table>,
    /// Set by the first export: until then `cuMemFree` does not look here (one relaxed load).
    any_export: AtomicBool,
    /// Set by the first import: until then `cuMemFree` does not look for imports either.
    any_import: AtomicBool,
}

/// The identity of a shareable POSIX file descriptor both processes compute: its file (`st_dev`, `st_ino`), the
/// same across `SCM_RIGHTS` and `pidfd_getfd`. Only a regular file (a memfd) has one of its own: a descriptor
/// opened on a device, as NVIDIA's driver makes its exports (every one an open of its control device), shares
/// its inode with every other export, so it identifies nothing (`None`, as when `fd` is not open).
pub(crate) fn fd_key(fd: i32) -> Option<u64> {
    // SAFETY: stat is plain data; fstat only reads the descriptor's file.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st)?
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(st.st_dev as u64).to_le_bytes());
    b[8..].copy_from_slice(&(st.st_ino as u64).to_le_bytes());
    Some(key(&b))
}

/// The identity both processes compute for a handle's bytes (IPC, fabric, pool export): the first 8 bytes of
/// their SHA-256. A tenant who can vary bytes the driver ignores must not be able to make another container's
/// export look like one of its own (which it would join, charged nothing): with FNV that took a few lines of
/// arithmetic, with SHA-256 it takes about 2^64 tries.
pub(crate) fn key(bytes: &[u8]) -> u64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(bytes);
    u64::from_le_bytes(d[..8].try_into().expect("a SHA-256 digest has 32 bytes"))
}

impl Shared {
    /// The export of the allocation at `p`, if it was exported.
    pub(super) fn exported(&self, p: u64) -> Option<Export> {
        self.table.lock().exports.get(&p).copied()
    }

    /// Records that the allocation at `p` was exported.
    pub(super) fn export(&self, p: u64, e: Export) {
        self.any_export.store(true, Ordering::Release);
        self.table.lock().exports.insert(p, e);
    }

    /// The allocation at `p` is being freed: its export, if any.
    #[inline]
    pub(super) fn take_export(&self, p: u64) -> Option<Export> {
        if !self.any_export.load(Ordering::Acquire) {
            return None;
        }
        self.take_export_slow(p)
    }

    #[inline(never)]
    fn take_export_slow(&self, p: u64) -> Option<Export> {
        self.table.lock().exports.remove(&p)
    }

    /// `cuIpcOpenMemHandle` returned `p` again (the driver counts a reference): true if it was open already.
    pub(super) fn open_again(&self, p: u64) -> bool {
        match self.table.lock().imports.get_mut(&p) {
            Some((_, n)) => {
                *n += 1;
                true
            }
            None => false,
        }
    }

    /// `cuIpcOpenMemHandle` (or `cuMemPoolImportPointer`) returned `p`, holding `hold`.
    pub(super) fn opened(&self, p: u64, hold: Hold) {
        self.any_import.store(true, Ordering::Release);
        self.table.lock().imports.insert(p, (hold, 1));
    }

    /// Whether `p` is an address this process imported (freed by `cuMemFree` for pool imports).
    #[inline]
    pub(super) fn imported(&self, p: u64) -> bool {
        self.any_import.load(Ordering::Acquire) && self.imported_slow(p)
    }

    #[inline(never)]
    fn imported_slow(&self, p: u64) -> bool {
        self.table.lock().imports.contains_key(&p)
    }

    /// `cuIpcCloseMemHandle(p)` succeeded.
    pub(super) fn close(&self, p: u64) -> Closed {
        let mut t = self.table.lock();
        let Some((hold, n)) = t.imports.get_mut(&p) else {
            return Closed::Unknown;
        };
        *n -= 1;
        if *n > 0 {
            return Closed::StillOpen;
        }
        let hold = *hold;
        t.imports.remove(&p);
        Closed::Last(hold)
    }

    /// The VMM handle `h` was exported.
    pub(super) fn vmm_export(&self, h: u64, e: Export) {
        self.table.lock().vmm_exports.insert(h, e);
    }

    /// Whether VMM handle `h` was exported.
    pub(super) fn vmm_exported(&self, h: u64) -> bool {
        self.table.lock().vmm_exports.contains_key(&h)
    }

    /// The memory of VMM handle `h` is gone here: its export, if any.
    pub(super) fn take_vmm_export(&self, h: u64) -> Option<Export> {
        self.table.lock().vmm_exports.remove(&h)
    }

    /// `cuMemImportFromShareableHandle` returned `h`, holding `hold`.
    pub(super) fn vmm_imported(&self, h: u64, hold: Option<Hold>) {
        self.table.lock().vmm_imports.insert(h, hold);
    }

    /// The hold of imported VMM handle `h` (`Some(None)`: imported, nothing charged yet); `None`: not an import.
    pub(super) fn vmm_import(&self, h: u64) -> Option<Option<Hold>> {
        self.table.lock().vmm_imports.get(&h).copied()
    }

    /// The memory of imported VMM handle `h` is gone here: its hold.
    pub(super) fn take_vmm_import(&self, h: u64) -> Option<Option<Hold>> {
        self.table.lock().vmm_imports.remove(&h)
    }

    /// This process let go of export `e` of `bytes` on `dev`, whose charge had moved to the shared table;
    /// `live(entry, key)` prunes those nobody holds any more.
    pub(super) fn linger(&self, e: Export, bytes: u64, dev: DeviceId, live: impl Fn(usize, u64) -> bool) {
        let mut t = self.table.lock();
        t.lingering.retain(|&(entry, key, _, _)| live(entry, key));
        if live(e.entry, e.key) {
            t.lingering.push((e.entry, e.key, bytes, dev));
        }
    }

    /// Bytes on `dev` of exports this process let go of that `live(entry, key)` says someone still holds
    /// (the others are forgotten).
    pub(super) fn lingering(&self, dev: DeviceId, live: impl Fn(usize, u64) -> bool) -> u64 {
        let mut t = self.table.lock();
        t.lingering.retain(|&(entry, key, _, _)| live(entry, key));
        t.lingering
            .iter()
            .filter(|l| l.3 == dev)
            .fold(0, |acc, l| acc.saturating_add(l.2))
    }

    /// Forgets everything (a forked child: the parent's exports and imports are not its own).
    pub(super) fn clear(&self) {
        *self.table.lock() = Table::default();
    }

    /// Takes the family's lock for the fork handlers.
    pub(super) fn fork_prepare(&self) {
        hold_all([&self.table]);
    }

    /// Undoes [`Shared::fork_prepare`].
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread (or in the child of that thread).
    pub(super) unsafe fn fork_release(&self, side: Side) {
        // SAFETY: locked by fork_prepare (the caller's contract).
        unsafe { release_all([&self.table], side) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_open_needs_its_own_close() {
        let (_r, dev) = crate::memory::tests::device_id();
        let m = Shared::default();
        let hold = Hold::Charged { dev, bytes: 7 };
        assert!(!m.open_again(0x1000));
        m.opened(0x1000, hold);
        assert!(m.open_again(0x1000));
        assert_eq!(m.close(0x1000), Closed::StillOpen);
        assert_eq!(m.close(0x1000), Closed::Last(hold));
        assert_eq!(m.close(0x1000), Closed::Unknown);
    }

    #[test]
    fn keys_differ_by_handle() {
        assert_ne!(key(&[1u8; 64]), key(&[2u8; 64]));
        assert_eq!(key(&[1u8; 64]), key(&[1u8; 64]));
    }

    #[test]
    fn a_free_finds_an_export_only_once_and_only_after_the_first_export() {
        let m = Shared::default();
        let e = Export {
            entry: 3,
            key: 0xabc,
            moved: true,
        };
        assert_eq!(
            m.take_export(0x1000),
            None,
            "nothing exported: not even the lock is taken"
        );
        m.export(0x1000, e);
        assert_eq!(m.exported(0x1000), Some(e));
        assert_eq!(m.exported(0x2000), None);
        assert_eq!(m.take_export(0x1000), Some(e));
        assert_eq!(m.take_export(0x1000), None, "freed once");
        assert!(!m.imported(0x1000), "an export is not an import");
    }

    #[test]
    fn a_vmm_handles_export_and_import_are_kept_apart_from_pointers() {
        let (_r, dev) = crate::memory::tests::device_id();
        let m = Shared::default();
        let e = Export {
            entry: 1,
            key: 7,
            moved: false,
        };
        m.vmm_export(0x10, e);
        assert!(m.vmm_exported(0x10));
        assert_eq!(m.take_export(0x10), None, "a handle is not a pointer");
        assert_eq!(m.take_vmm_export(0x10), Some(e));
        assert!(!m.vmm_exported(0x10));
        assert_eq!(m.vmm_import(0x20), None);
        m.vmm_imported(0x20, None);
        assert_eq!(
            m.vmm_import(0x20),
            Some(None),
            "another container's: nothing charged yet"
        );
        let hold = Hold::Charged { dev, bytes: 5 };
        m.vmm_imported(0x30, Some(hold));
        assert_eq!(m.take_vmm_import(0x30), Some(Some(hold)));
        assert_eq!(m.take_vmm_import(0x30), None);
        assert!(!m.imported(0x20), "a handle is not an imported address");
    }

    #[test]
    fn lingering_exports_count_on_their_device_until_nobody_holds_them() {
        let t = crate::memory::tests::temp_path("linger");
        let r = cuquota_core::UsageRegion::open(&t.path).expect("usage region");
        let (dev, other) = (
            r.device(&[1; 16]).expect("entry"),
            r.device(&[2; 16]).expect("entry"),
        );
        let m = Shared::default();
        let live = std::cell::RefCell::new(vec![(1usize, 11u64), (2, 22)]);
        let is_live = |entry, key| live.borrow().contains(&(entry, key));
        m.linger(
            Export {
                entry: 1,
                key: 11,
                moved: true,
            },
            100,
            dev,
            is_live,
        );
        m.linger(
            Export {
                entry: 2,
                key: 22,
                moved: true,
            },
            50,
            other,
            is_live,
        );
        // Nobody holds it any more: not even recorded.
        m.linger(
            Export {
                entry: 3,
                key: 33,
                moved: true,
            },
            1000,
            dev,
            is_live,
        );
        assert_eq!(m.lingering(dev, is_live), 100);
        assert_eq!(m.lingering(other, is_live), 50);
        live.borrow_mut().retain(|&(e, _)| e != 1);
        assert_eq!(m.lingering(dev, is_live), 0, "its last importer let go");
        live.borrow_mut().push((1, 11));
        assert_eq!(m.lingering(dev, is_live), 0, "forgotten for good");
        m.clear();
        assert_eq!(
            m.lingering(other, |_, _| true),
            0,
            "a forked child lingers on nothing"
        );
    }
}
