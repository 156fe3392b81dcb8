//! Virtual memory management (create, map, unmap, release; sparse-array and multicast bindings): a handle's
//! charge lasts until its memory is really gone, every reference released and every mapping or binding undone.
//! The references and mappings are `vmm::VmmLives`'s; [`Memory::vmm`] is the one door hooks call around the
//! driver ([`VmmCall`] says which call).

use super::ledger::{Record, Space};
use super::shared::Hold;
use super::vmm::{BindKey, Release, Unmapped};
use super::Memory;
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;

/// A VMM call [`Memory::vmm`] wraps, its arguments decoded. `out` reads the handle the call wrote, once it
/// succeeded (`None`: no handle written).
pub(crate) enum VmmCall<'a> {
    /// `cuMemCreate` of `size` bytes on `dev`.
    Create {
        dev: Dev,
        size: u64,
        out: &'a dyn Fn() -> Option<u64>,
    },
    /// `cuMemRetainAllocationHandle`: one more reference to release.
    Retain { out: &'a dyn Fn() -> Option<u64> },
    /// `cuMemRelease` of a handle.
    Release(u64),
    /// `cuMemMap` of the bytes `within` `handle`'s allocation at `ptr`.
    Map {
        ptr: u64,
        within: std::ops::Range<u64>,
        handle: u64,
    },
    /// `cuMemUnmap` of `size` bytes at `ptr`.
    Unmap { ptr: u64, size: u64 },
    /// `cuMemExportToShareableHandle` of `handle`, the shareable handle keyed `key()` (`None`: a type the shim
    /// cannot identify); `undo` closes what the driver made when the export is refused.
    Export {
        handle: u64,
        key: &'a dyn Fn() -> Option<u64>,
        undo: &'a dyn Fn(),
    },
    /// `cuMemImportFromShareableHandle` of the shareable handle keyed `key`.
    Import {
        out: &'a dyn Fn() -> Option<u64>,
        key: Option<u64>,
    },
    /// `cuMemMapArrayAsync` of `maps` (tile key, handle) and `unmaps` (tile keys).
    MapArray {
        maps: &'a [(BindKey, u64)],
        unmaps: &'a [BindKey],
    },
    /// `cuArrayDestroy` (`cuMipmappedArrayDestroy`: `mipmapped`) of `h`.
    ArrayDestroy { h: u64, mipmapped: bool },
    /// `cuMulticastCreate`.
    MulticastCreate { out: &'a dyn Fn() -> Option<u64> },
    /// `cuMulticastBindMem` (`mem`) / `cuMulticastBindAddr` (the handle mapped at `memptr`), bound under
    /// `key(its device)`.
    MulticastBind {
        mem: Option<u64>,
        memptr: u64,
        key: &'a dyn Fn(CUdevice) -> BindKey,
    },
    /// `cuMulticastUnbind` of the binding `key`.
    MulticastUnbind(BindKey),
}

impl Memory {
    /// `call`, the VMM call `what` describes, with what memory follows of VMM handles: a handle's charge lasts
    /// until its memory is really gone (every reference released, every mapping or binding undone); an export
    /// moves it into the container's shared table, an import joins it or is charged from its first mapping.
    /// `CUDA_ERROR_OUT_OF_MEMORY` (driver not called) when a charge does not fit.
    pub(crate) fn vmm(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        what: VmmCall<'_>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let made = |out: &dyn Fn() -> Option<u64>, r: CUresult| if r.ok() { out() } else { None };
        match what {
            VmmCall::Create { dev, size, out } => self.vmm_create(cuda, nvml, dev, size, call, out),
            VmmCall::Retain { out } => {
                let r = call();
                if let Some(h) = made(out, r) {
                    self.vmm.retained(h);
                }
                r
            }
            VmmCall::Release(h) => self.vmm_release(cuda, h, call),
            VmmCall::Map { ptr, within, handle } => self.vmm_map(cuda, nvml, ptr, within, handle, call),
            VmmCall::Unmap { ptr, size } => {
                let u = self.vmm.unmap(ptr, size);
                self.unmapping(cuda, u, call)
            }
            VmmCall::Export { handle, key, undo } => self.exported_handle(call(), handle, key, undo),
            VmmCall::Import { out, key } => {
                let r = call();
                if let Some(h) = made(out, r) {
                    self.imported_handle(h, key);
                }
                r
            }
            VmmCall::MapArray { maps, unmaps } => self.map_array(cuda, maps, unmaps, call),
            VmmCall::ArrayDestroy { h, mipmapped } => {
                let space = if mipmapped { Space::Mipmapped } else { Space::Array };
                self.array_destroy(cuda, space, h, call)
            }
            VmmCall::MulticastCreate { out } => {
                let r = call();
                if let Some(mc) = made(out, r) {
                    self.vmm.multicast_created(mc);
                }
                r
            }
            VmmCall::MulticastBind { mem, memptr, key } => {
                self.multicast_bound(cuda, call(), mem, memptr, key)
            }
            VmmCall::MulticastUnbind(key) => {
                let u = self.vmm.unbind(|k| *k == key);
                self.unmapping(cuda, u, call)
            }
        }
    }

    /// `cuMemCreate` of `size` bytes on `dev` through `call`, which writes the handle `out()` reads.
    fn vmm_create(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        dev: Dev,
        size: u64,
        call: impl FnOnce() -> CUresult,
        out: &dyn Fn() -> Option<u64>,
    ) -> CUresult {
        let est = self.devices.round(cuda, dev, size);
        let mut created = None;
        let r = self.charged_call(cuda, nvml, dev, est, call, || {
            let h = out()?;
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
    fn vmm_release(&self, cuda: &CudaTable, handle: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        match self.vmm.release(handle) {
            Release::Untracked => self.free(cuda, Space::Vmm, handle, None, call),
            Release::Last => {
                // A multicast object's last reference unbinds what was bound to it.
                let u = self.vmm.released_multicast(handle);
                self.unmapping(cuda, u, || {
                    let rec = self.allocs.ledger().remove(Space::Vmm, handle);
                    let r = call();
                    if r.ok() {
                        self.vmm_gone(cuda, handle, rec);
                    } else {
                        if let Some(rec) = rec {
                            self.allocs.ledger().insert(Space::Vmm, handle, rec);
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

    /// `cuMemMap` of the bytes `within` `handle`'s allocation at `ptr` through `call`: a mapping keeps its allocation (and its charge) alive. Memory imported from another
    /// container is charged to this process up to the furthest byte any of its mappings reached (no size is
    /// known before: fail closed from here on).
    fn vmm_map(
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

    /// Runs `call`, which undoes the mappings or bindings `u` took: the memory that goes with them stops being
    /// charged if the driver says yes; they are put back if it refuses.
    fn unmapping(&self, cuda: &CudaTable, u: Unmapped, call: impl FnOnce() -> CUresult) -> CUresult {
        // Records leave the ledger before the call, as in `Memory::free`: once the memory is gone the driver may
        // hand the handle value out again.
        let gone: Vec<(u64, Record)> = u
            .dead
            .iter()
            .filter_map(|&h| Some((h, self.allocs.ledger().remove(Space::Vmm, h)?)))
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
                self.allocs.ledger().insert(Space::Vmm, h, rec);
            }
            self.vmm.undo_unmap(u);
        }
        r
    }

    /// Handles whose memory went with a binding the driver replaced.
    fn gone_now(&self, cuda: &CudaTable, dead: Vec<u64>) {
        for h in dead {
            let rec = self.allocs.ledger().remove(Space::Vmm, h);
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
    fn map_array(
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

    /// `cuMulticastBindMem` / `cuMulticastBindAddr` returned `r`, binding `mem` (or the handle this process
    /// mapped at `memptr`) under `key(its device)`: the bound memory stays charged while bound, its handle
    /// released or not.
    fn multicast_bound(
        &self,
        cuda: &CudaTable,
        r: CUresult,
        mem: Option<u64>,
        memptr: u64,
        key: &dyn Fn(CUdevice) -> BindKey,
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

    /// `cuArrayDestroy` / `cuMipmappedArrayDestroy` of `h` through `call`: what was bound to a sparse array's
    /// tiles goes with it.
    fn array_destroy(
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
