//! Memory shared between processes (CUDA IPC, pool export data, POSIX descriptors and fabric handles): an
//! export moves the allocation's charge into the container's shared table under the handle's key, where an
//! importer of the same container finds it; an import of another container's memory is charged to the importer
//! until it lets go of it. The bookkeeping is `shared::Shared`'s; [`Memory::ipc`] is the door hooks call
//! around the driver (a VMM handle's export and import: `Memory::vmm`).

use super::driver::Driver;
use super::ledger::{Record, Space};
use super::shared::{Export, Hold};
use super::Memory;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;
use crate::log::{log, Level};

/// An interprocess call [`Memory::ipc`] wraps, its arguments decoded; `what` names the call in logs.
pub(crate) enum IpcCall<'a> {
    /// `cuIpcGetMemHandle` / `cuMemPoolExportPointer` of the allocation at `ptr`; `key` reads the key of the
    /// handle's bytes once the call succeeded (`None`: nowhere to read them).
    Export {
        what: &'a str,
        ptr: u64,
        key: &'a dyn Fn() -> Option<u64>,
    },
    /// `cuIpcOpenMemHandle` / `cuMemPoolImportPointer` of the memory exported under `key`; `out` reads the
    /// address once the call succeeded; `undo(it)` gives a refused import back to the driver.
    Import {
        what: &'a str,
        key: u64,
        out: &'a dyn Fn() -> Option<u64>,
        undo: &'a dyn Fn(u64),
    },
    /// `cuIpcCloseMemHandle` of the import at this address.
    Close(u64),
}

/// The size of the import mapped at `p` (`cuMemGetAddressRange`); `None` when the driver will not say.
fn import_size(d: &impl Driver, p: u64) -> Option<u64> {
    d.address_size(p).ok().filter(|&n| n > 0).map(|n| n as u64)
}

impl Memory {
    /// `call`, the interprocess call `what` describes: an export moves the allocation's charge into the
    /// container's shared table (a full table refuses it: `CUDA_ERROR_OUT_OF_MEMORY`); an import joins this
    /// container's entry or is charged to this process (refused and given back when it does not fit); the last
    /// close lets go of the hold.
    pub(crate) fn ipc(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        what: IpcCall<'_>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        match what {
            IpcCall::Export { what, ptr, key } => self.exported_pointer(call(), ptr, key, what),
            IpcCall::Import { what, key, out, undo } => {
                let r = call();
                match r.ok().then(out).flatten() {
                    Some(p) => self.imported_pointer(cuda, nvml, r, p, key, what, undo),
                    None => r,
                }
            }
            IpcCall::Close(p) => {
                let r = call();
                if r.ok() {
                    self.let_go(self.shared.close(p));
                }
                r
            }
        }
    }

    /// The export by `what` (returning `r`) of the allocation at `p` under `key` (its handle's bytes, read
    /// only when needed): its charge moves into the container's shared table. A full table refuses it.
    fn exported_pointer(&self, r: CUresult, p: u64, key: &dyn Fn() -> Option<u64>, what: &str) -> CUresult {
        if !r.ok() || self.shared.exported(p).is_some() {
            return r;
        }
        let Some(rec) = self.allocs.ledger().get(Space::Pointer, p) else {
            return r;
        };
        let Some(key) = key() else {
            return r;
        };
        match self.share_record(rec, key, what) {
            Some(e) => {
                self.shared.export(p, e);
                r
            }
            None => CUresult::ERROR_OUT_OF_MEMORY,
        }
    }

    /// Moves the charge of `rec` into the container's shared table under `key` (an export by `what`); `None`
    /// (logged): the table is full.
    fn share_record(&self, rec: Record, key: u64, what: &str) -> Option<Export> {
        let Some((entry, moved)) = self.share(rec.entry, key, rec.bytes) else {
            log!(
                Level::Error,
                "{what} refused: the container's table of memory shared between processes is full \
                 ({} entries); free or release exported allocations first",
                cuquota_core::region::layout::MAX_SHARED
            );
            return None;
        };
        Some(Export { entry, key, moved })
    }

    /// An import by `what` (returning `r`, mapped at `p`) of the memory exported under `key`: memory this
    /// container exported is already charged (this process joins its shared entry); memory another container
    /// exported is charged to this process until it lets go of it, and refused (`undo` gives it back to the
    /// driver) when it does not fit.
    #[allow(clippy::too_many_arguments)]
    fn imported_pointer(
        &self,
        cuda: &CudaTable,
        nvml: &Nvml,
        r: CUresult,
        p: u64,
        key: u64,
        what: &str,
        undo: &dyn Fn(u64),
    ) -> CUresult {
        if self.shared.open_again(p) {
            return r;
        }
        if let Some(entry) = self.join_shared(key) {
            self.shared.opened(p, Hold::Shared { entry, key });
            return r;
        }
        let refuse = |why: &str| {
            log!(Level::Error, "{what} refused: {why}");
            undo(p);
            CUresult::ERROR_OUT_OF_MEMORY
        };
        // The memory's own device: opened with peer access it need not be the current context's.
        let dev = match cuda.pointer_device(p) {
            Ok(ordinal) => self.devices.device(cuda, ordinal),
            Err(_) => self.devices.current(cuda),
        };
        let Some(dev) = dev else {
            return if self.devices.refuse_unplaced() {
                refuse("no accounting identity for the current device")
            } else {
                r
            };
        };
        let Some(bytes) = import_size(cuda, p) else {
            return refuse("its size is unknown (cuMemGetAddressRange failed)");
        };
        let Ok(charge) = self.charge(dev, bytes, cuda, nvml) else {
            return refuse(&format!(
                "{bytes} bytes from another container do not fit under the memory limit"
            ));
        };
        let bytes = charge.keep();
        self.shared.opened(p, Hold::Charged { dev: dev.id, bytes });
        r
    }

    /// The export (returning `r`) of VMM handle `handle` as a shareable handle keyed `key` (`None`: a type the
    /// shim cannot identify): its charge moves into the shared table. A full table refuses it (`undo` closes
    /// what the driver made).
    pub(super) fn exported_handle(
        &self,
        r: CUresult,
        handle: u64,
        key: &dyn Fn() -> Option<u64>,
        undo: &dyn Fn(),
    ) -> CUresult {
        if r.ok() {
            self.vmm.exported(handle);
        }
        if !r.ok() || self.shared.vmm_exported(handle) {
            return r;
        }
        let Some(rec) = self.allocs.ledger().get(Space::Vmm, handle) else {
            return r;
        };
        let Some(key) = key() else {
            return r;
        };
        match self.share_record(rec, key, "cuMemExportToShareableHandle") {
            Some(e) => {
                self.shared.vmm_export(handle, e);
                r
            }
            None => {
                undo();
                CUresult::ERROR_OUT_OF_MEMORY
            }
        }
    }

    /// The import of VMM handle `h` (the import of the shareable handle keyed `key`, if the shim can identify
    /// it) succeeded: memory this container exported joins its shared entry; any other import is charged from
    /// its first mapping (`Memory::vmm_map`) until its last reference and mapping go.
    pub(super) fn imported_handle(&self, h: u64, key: Option<u64>) {
        if self.allocs.ledger().get(Space::Vmm, h).is_some() || self.shared.vmm_import(h).is_some() {
            // A handle this process has already (the driver gave the same one again): one more reference.
            self.vmm.retained(h);
            return;
        }
        self.vmm.created(h);
        let hold = key.and_then(|key| {
            Some(Hold::Shared {
                entry: self.join_shared(key)?,
                key,
            })
        });
        self.shared.vmm_imported(h, hold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::driver::fake::Fake;

    #[test]
    fn an_import_is_charged_its_size_and_one_the_driver_cannot_size_is_refused() {
        let d = Fake::default();
        d.allocations.borrow_mut().insert(0x1000, (0, 3 << 20));
        d.allocations.borrow_mut().insert(0x2000, (1, 0));
        assert_eq!(import_size(&d, 0x1000), Some(3 << 20));
        assert_eq!(import_size(&d, 0x2000), None, "an empty range sizes nothing");
        assert_eq!(import_size(&d, 0x3000), None, "the driver refused");
    }
}
