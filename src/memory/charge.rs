//! The steps every allocation and free takes, behind one interface: admission returns a [`Charge`] guard
//! (`commit` records the object and settles the charge to its exact size; dropping it un-committed gives the
//! charge back), and a free removes the record *before* the driver is called (so a racing allocation that reuses
//! the address cannot be removed by mistake) and restores it if the driver refuses. A free of something the
//! ledger does not know goes to the driver unchanged.

use super::ledger::{Kind, Record, Space};
use super::shared::{Closed, Hold};
use super::{Admitted, Memory, OverCap};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::CUresult;

/// Bytes admitted on a device and not yet recorded. Hold it until the driver call returned (a reservation's
/// announcement lives in it); [`Charge::commit`] records the object, dropping it gives the bytes back.
#[must_use = "commit it, or drop it to give the charge back"]
pub(crate) struct Charge<'a> {
    mem: &'a Memory,
    dev: Dev,
    bytes: u64,
    _admitted: Admitted<'a>,
}

impl Charge<'_> {
    /// Records the object at `key` in `space`, its charge corrected from the admitted estimate to `exact`
    /// (`None`: the estimate).
    #[inline(always)]
    pub(crate) fn commit(mut self, space: Space, key: u64, exact: Option<u64>) {
        let bytes = exact.unwrap_or(self.bytes);
        if bytes != self.bytes {
            self.mem.settle(self.dev, self.bytes, bytes);
        }
        let rec = Record {
            entry: self.dev.id,
            bytes,
            kind: Kind::Direct,
        };
        let stale = self.mem.allocs.ledger().insert(space, key, rec);
        self.mem.release_stale(stale);
        self.bytes = 0;
    }

    /// Keeps the charge without a ledger record (an import's hold, a pool's settlement): the bytes charged.
    pub(crate) fn keep(mut self) -> u64 {
        std::mem::take(&mut self.bytes)
    }
}

impl Drop for Charge<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.bytes != 0 {
            self.mem.release(self.dev, self.bytes);
        }
    }
}

impl Memory {
    /// Admits `bytes` on `dev` (see [`Memory::admit`]) as a guard that gives them back unless committed.
    #[inline]
    pub(crate) fn charge(
        &self,
        dev: Dev,
        bytes: u64,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Charge<'_>, OverCap> {
        let admitted = self.admit(dev, bytes, cuda, nvml)?;
        Ok(Charge {
            mem: self,
            dev,
            bytes,
            _admitted: admitted,
        })
    }

    /// Admits `estimate` on `dev`, calls `call`; on success commits `exact()`: the object's space, key and exact
    /// byte count (already rounded; `None` keeps the estimate), or nothing to record (the charge goes back).
    /// Returns OOM without calling the driver when the estimate does not fit.
    pub(super) fn charged_call(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        dev: Dev,
        estimate: u64,
        call: impl FnOnce() -> CUresult,
        exact: impl FnOnce() -> Option<(Space, u64, Option<u64>)>,
    ) -> CUresult {
        let Ok(charge) = self.charge(dev, estimate, cuda, nvml) else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = call();
        if r.ok() {
            if let Some((space, key, bytes)) = exact() {
                charge.commit(space, key, bytes);
            }
        }
        r
    }

    /// A key the driver handed out again still had a record (see `Allocs::release_stale`).
    #[inline]
    pub(super) fn release_stale(&self, stale: Option<Record>) {
        self.allocs.release_stale(self.overhead.charged(), stale);
    }

    /// Frees `key` through `call`, uncharging what the ledger holds for it; untracked → `call` alone.
    /// `stream`: a stream-ordered free's stream key, else `None`.
    pub(crate) fn free(
        &self,
        cuda: &CudaTable,
        space: Space,
        key: u64,
        stream: Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        // A pool's destroy cannot count a record out of the ledger: the free is announced to the pool first.
        let Some(rec) = self.allocs.ledger().remove_seen(space, key, |r| {
            if let Kind::Pool(pool) = r.kind {
                self.pools.free_begins(pool);
            }
        }) else {
            return call();
        };
        let r = call();
        if let Kind::Pool(pool) = rec.kind {
            if r.ok() {
                self.pools
                    .free_done_back(cuda, self, pool, key, rec.bytes, stream);
            } else {
                self.allocs.ledger().insert(space, key, rec);
                self.pools
                    .free_refused_back(self, self.allocs.ledger(), pool, key);
            }
            return r;
        }
        if r.ok() {
            self.allocs.release(self.overhead.charged(), rec.entry, rec.bytes);
        } else {
            self.allocs.ledger().insert(space, key, rec);
        }
        r
    }

    /// A free of the device address `p`: an export lets go of its shared entry (importers may still hold the
    /// memory: the charge stays until the last of them closes it), an import of its hold, anything else of
    /// its record (`stream`: the stream key of a free in stream order).
    pub(super) fn free_pointer(
        &self,
        cuda: &CudaTable,
        p: u64,
        stream: Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if let Some(e) = self.shared.take_export(p) {
            let rec = self.allocs.ledger().remove(Space::Pointer, p);
            let r = call();
            if !r.ok() {
                if let Some(rec) = rec {
                    self.allocs.ledger().insert(Space::Pointer, p, rec);
                }
                self.shared.export(p, e);
                return r;
            }
            self.export_gone(cuda, p, e, rec, stream);
            return r;
        }
        if self.shared.imported(p) {
            // An imported pool allocation (`cuMemPoolImportPointer`): its hold goes with the free.
            let r = call();
            if r.ok() {
                self.let_go(self.shared.close(p));
            }
            return r;
        }
        self.free(cuda, Space::Pointer, p, stream, call)
    }

    /// An allocation whose device has no accounting identity. Without a context (or with a bad ordinal) the
    /// driver gives its own error; a real device that found no room in the usage region is refused while memory
    /// limits apply, so it can never become a way around the cap.
    pub(super) fn untracked(&self, call: impl FnOnce() -> CUresult) -> CUresult {
        if self.devices.refuse_unplaced() {
            CUresult::ERROR_OUT_OF_MEMORY
        } else {
            call()
        }
    }

    /// An import's last reference is gone: its hold goes.
    pub(super) fn let_go(&self, closed: Closed) {
        match closed {
            Closed::Last(Hold::Shared { entry, key }) => self.unshare(entry, key),
            Closed::Last(Hold::Charged { dev, bytes }) => self.release_entry(dev, bytes),
            Closed::StillOpen | Closed::Unknown => {}
        }
    }
}
