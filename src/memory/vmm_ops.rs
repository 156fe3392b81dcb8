//! Virtual memory management (create, map, unmap, release; sparse-array and multicast bindings): a handle's
//! charge lasts until its memory is really gone, every reference released and every mapping or binding undone.
//! The references and mappings are `vmm::VmmLives`'s; this is the interface the hooks call around the driver.

use super::ledger::{Record, Space};
use super::shared::Hold;
use super::vmm::{BindKey, Release, Unmapped};
use super::Memory;
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;

impl Memory {
    /// `cuMemCreate` of `size` bytes on `dev` through `call`, which writes the handle `out()` reads.
    pub(crate) fn vmm_create(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        dev: Dev,
        size: u64,
        call: impl FnOnce() -> CUresult,
        out: impl FnOnce() -> u64,
    ) -> CUresult {
        let est = self.devices.round(cuda, dev, size);
        let mut created = None;
        let r = self.charged_call(cuda, nvml, dev, est, call, || {
            let h = out();
            created = Some(h);
            Some((Space::Vmm, h, None))
        });
        if let Some(h) = created {
            self.vmm.created(h);
        }
        r
    }

    /// `cuMemRelease` of `handle` through `call`: one reference fewer; the charge goes with the last one of an
    /// unmapped allocation (a multicast object's bindings with its own).
    pub(crate) fn vmm_release(
        &self,
        cuda: &CudaTable,
        handle: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match self.vmm.release(handle) {
            Release::Untracked => self.free(cuda, Space::Vmm, handle, None, call),
            Release::Last => {
                // A multicast object's last reference unbinds what was bound to it.
                let u = self.vmm.released_multicast(handle);
                self.unmapping(cuda, u, || {
                    let rec = self.ledger.remove(Space::Vmm, handle);
                    let r = call();
                    if r.ok() {
                        self.vmm_gone(cuda, handle, rec);
                    } else {
                        if let Some(rec) = rec {
                            self.ledger.insert(Space::Vmm, handle, rec);
                        }
                        self.vmm.undo_release(handle, Release::Last);
                    }
                    r
                })
            }
            was @ (Release::Kept | Release::Again) => {
                let r = call();
                if !r.ok() {
                    self.vmm.undo_release(handle, was);
                }
                r
            }
        }
    }

    /// `cuMemRetainAllocationHandle` returned `h`: one more reference to release.
    pub(crate) fn vmm_retained(&self, h: u64) {
        self.vmm.retained(h);
    }

    /// `cuMemMap` of the bytes `within` `handle`'s allocation at `ptr` through `call`: a mapping keeps its allocation (and its charge) alive. Memory imported from another
    /// container is charged to this process up to the furthest byte any of its mappings reached (no size is
    /// known before: fail closed from here on).
    pub(crate) fn vmm_map(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        ptr: u64,
        within: std::ops::Range<u64>,
        handle: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let (size, end) = (within.end.saturating_sub(within.start), within.end);
        // Another container's allocation is at least as large as the furthest byte any mapping reaches
        // (`offset + size`): mapped in pieces, it is charged for all of them, not for one piece.
        let foreign = match self.shared.vmm_import(handle) {
            Some(None) => Some(0),
            Some(Some(Hold::Charged { bytes, .. })) if bytes < end => Some(bytes),
            _ => None,
        };
        let Some(had) = foreign else {
            let r = call();
            if r.ok() {
                self.vmm.mapped(ptr, size, handle);
            }
            return r;
        };
        // The memory's own device, which the mapping's context need not be on.
        // SAFETY: plain data the driver fills in on success.
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; `handle` forwarded.
        let on = unsafe { cuda.cuMemGetAllocationPropertiesFromHandle(&mut prop, handle) };
        let dev = if on.ok() && prop.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            self.devices.device(cuda, prop.location.id)
        } else {
            self.devices.current(cuda)
        };
        let Some(dev) = dev else {
            return self.untracked(call);
        };
        let Ok(charge) = self.charge(dev, end - had, cuda, nvml) else {
            return CUresult::ERROR_OUT_OF_MEMORY;
        };
        let r = call();
        if r.ok() {
            charge.keep();
            self.vmm.mapped(ptr, size, handle);
            let hold = Hold::Charged {
                dev: dev.id,
                bytes: end,
            };
            self.shared.vmm_imported(handle, Some(hold));
        }
        r
    }

    /// `cuMemUnmap` of `size` bytes at `ptr` through `call`: the last mapping of a released allocation takes
    /// its charge with it.
    pub(crate) fn vmm_unmap(
        &self,
        cuda: &CudaTable,
        ptr: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let u = self.vmm.unmap(ptr, size);
        self.unmapping(cuda, u, call)
    }

    /// Runs `call`, which undoes the mappings or bindings `u` took: the memory that goes with them stops being
    /// charged if the driver says yes; they are put back if it refuses.
    fn unmapping(&self, cuda: &CudaTable, u: Unmapped, call: impl FnOnce() -> CUresult) -> CUresult {
        // Records leave the ledger before the call, as in `Memory::free`: once the memory is gone the driver may
        // hand the handle value out again.
        let gone: Vec<(u64, Record)> = u
            .dead
            .iter()
            .filter_map(|&h| Some((h, self.ledger.remove(Space::Vmm, h)?)))
            .collect();
        let r = call();
        if r.ok() {
            let charged: Vec<u64> = gone.iter().map(|&(h, _)| h).collect();
            for (h, rec) in gone {
                self.vmm_gone(cuda, h, Some(rec));
            }
            // Imports charge nothing in the ledger: their holds go too.
            for &h in u.dead.iter().filter(|h| !charged.contains(h)) {
                self.vmm_gone(cuda, h, None);
            }
        } else {
            for (h, rec) in gone {
                self.ledger.insert(Space::Vmm, h, rec);
            }
            self.vmm.undo_unmap(u);
        }
        r
    }

    /// Handles whose memory went with a binding the driver replaced.
    fn gone_now(&self, cuda: &CudaTable, dead: Vec<u64>) {
        for h in dead {
            let rec = self.ledger.remove(Space::Vmm, h);
            self.vmm_gone(cuda, h, rec);
        }
    }

    /// The memory of VMM handle `h` is gone from this process (last reference released, last mapping unmapped):
    /// its charge (`rec`), or its share of the container's shared table, or its import's hold, goes.
    fn vmm_gone(&self, cuda: &CudaTable, h: u64, rec: Option<Record>) {
        if let Some(e) = self.shared.take_vmm_export(h) {
            self.export_gone(cuda, h, e, rec, None);
            return;
        }
        if let Some(rec) = rec {
            self.release_entry(rec.entry, rec.bytes);
        }
        match self.shared.take_vmm_import(h) {
            Some(Some(Hold::Shared { entry, key })) => self.unshare(entry, key),
            Some(Some(Hold::Charged { dev, bytes })) => self.release_entry(dev, bytes),
            Some(None) | None => {}
        }
    }

    /// `cuMemMapArrayAsync` through `call` of `maps` (tile key, handle) and `unmaps` (tile keys): a VMM handle
    /// bound to a sparse array's tile holds its memory as a mapping does (a released handle stays charged
    /// while bound); an unmap lets go of it. cuda.h does not promise a failed list changed nothing: on failure
    /// its maps stay charged as bound and its unmaps as not undone (fail closed, until an unmap of the same
    /// tile or the array's destruction).
    pub(crate) fn map_array(
        &self,
        cuda: &CudaTable,
        maps: &[(BindKey, u64)],
        unmaps: &[BindKey],
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let u = self.vmm.unbind(|k| unmaps.contains(k));
        let r = self.unmapping(cuda, u, call);
        for &(key, h) in maps {
            if r.ok() {
                self.gone_now(cuda, self.vmm.bound(key, h));
            } else {
                self.vmm.maybe_bound(key, h);
            }
        }
        r
    }

    /// `cuMulticastCreate` made `mc`: its references and mappings are followed as a VMM handle's, so that its
    /// last release lets go of what is bound to it.
    pub(crate) fn multicast_created(&self, mc: u64) {
        self.vmm.multicast_created(mc);
    }

    /// `cuMulticastBindMem` / `cuMulticastBindAddr` returned `r`, binding `mem` (or the handle this process
    /// mapped at `memptr`) under `key(its device)`: the bound memory stays charged while bound, its handle
    /// released or not.
    pub(crate) fn multicast_bound(
        &self,
        cuda: &CudaTable,
        r: CUresult,
        mem: Option<u64>,
        memptr: u64,
        key: impl FnOnce(CUdevice) -> BindKey,
    ) -> CUresult {
        if !r.ok() {
            return r;
        }
        let Some(h) = mem.or_else(|| self.vmm.handle_at(memptr)) else {
            return r;
        };
        // SAFETY: plain data the driver fills in on success.
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; a handle the driver just bound.
        let on = unsafe { cuda.cuMemGetAllocationPropertiesFromHandle(&mut prop, h) };
        // Unknown device: no unbind names it, the binding stays charged until the object goes (fail closed).
        let dev = if on.ok() { prop.location.id } else { -1 };
        self.gone_now(cuda, self.vmm.bound(key(dev), h));
        r
    }

    /// `cuMulticastUnbind` through `call` of the binding `key` (cuda.h: offset and size must match the bind's;
    /// the driver unbinds nothing else).
    pub(crate) fn multicast_unbind(
        &self,
        cuda: &CudaTable,
        key: BindKey,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let u = self.vmm.unbind(|k| *k == key);
        self.unmapping(cuda, u, call)
    }

    /// `cuArrayDestroy` / `cuMipmappedArrayDestroy` of `h` through `call`: what was bound to a sparse array's
    /// tiles goes with it.
    pub(crate) fn array_destroy(
        &self,
        cuda: &CudaTable,
        space: Space,
        h: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !self.vmm.has_binds() {
            return self.free(cuda, space, h, None, call);
        }
        let u = self.vmm.unbind(|k| k.obj == super::vmm::Obj::Array(h));
        self.unmapping(cuda, u, || self.free(cuda, space, h, None, call))
    }
}
