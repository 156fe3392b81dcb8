//! What hooks reach of memory, one view per family (issue 37): `Memory::allocs`, `Memory::first_use` and
//! `Memory::overhead` hand out a borrowed view whose few methods are the family's whole interface to hooks; each
//! composes the family (`Allocs`, `FirstUse`, `Overhead`, which own their state) with what it needs of the
//! others. A view is one pointer and every method `#[inline(always)]`: the hot paths (launch, alloc, free)
//! compile as if hooks called the family directly (the gate, bench/README.md, measured them unchanged).

use super::first_use::FirstUse;
#[cfg(test)]
use super::ledger::Record;
use super::ledger::Space;
#[cfg(test)]
use super::overhead::Creating;
#[cfg(test)]
use super::{Admitted, Creation, OverCap};
use super::{Launch, Memory, OverheadCall, Owner, Use};
use crate::devices::Dev;
use crate::driver::cuda::CudaTable;
use crate::driver::nvml::Nvml;
use crate::ffi::cuda::*;

/// Allocations: admission against the cap, the charged call, the free, and what `cuMemGetInfo` reports.
#[derive(Clone, Copy)]
pub(crate) struct AllocCalls<'a>(&'a Memory);

impl<'a> AllocCalls<'a> {
    /// Admits `estimate` on `dev`, calls `call`, commits `exact()` (see `Memory::charged_call`).
    #[inline(always)]
    pub(crate) fn charged_call(
        self,
        cuda: &CudaTable,
        nvml: &Nvml,
        dev: Dev,
        estimate: u64,
        call: impl FnOnce() -> CUresult,
        exact: impl FnOnce() -> Option<(Space, u64, Option<u64>)>,
    ) -> CUresult {
        self.0.charged_call(cuda, nvml, dev, estimate, call, exact)
    }

    /// A free of the device address `p` (see `Memory::free_pointer`).
    #[inline(always)]
    pub(crate) fn free_pointer(
        self,
        cuda: &CudaTable,
        p: u64,
        stream: Option<usize>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.0.free_pointer(cuda, p, stream, call)
    }

    /// An allocation whose device has no accounting identity (see `Memory::untracked`).
    #[inline(always)]
    pub(crate) fn untracked(self, call: impl FnOnce() -> CUresult) -> CUresult {
        self.0.untracked(call)
    }

    /// What `cuMemGetInfo` of `dev` capped at `cap` reports used (see `Memory::info_used`).
    #[inline(always)]
    pub(crate) fn info_used(self, cuda: &CudaTable, nvml: &Nvml, dev: Dev, cap: u64) -> u64 {
        self.0.info_used(cuda, nvml, dev, cap)
    }

    /// Bytes the whole container has charged on `dev`.
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn container_used(self, dev: Dev) -> u64 {
        self.0.container_used(dev)
    }

    /// Reserves `bytes` on `dev` (see `Memory::admit`).
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn admit(
        self,
        dev: Dev,
        bytes: u64,
        cuda: &CudaTable,
        nvml: &Nvml,
    ) -> Result<Admitted<'a>, OverCap> {
        self.0.admit(dev, bytes, cuda, nvml)
    }

    /// Charges `bytes` whatever the limit (the driver already handed the memory out).
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn force(self, dev: Dev, bytes: u64) {
        self.0.force(dev, bytes)
    }

    /// Puts a record in the ledger as if an allocation had made it (unit tests of what hooks do with it).
    #[cfg(test)]
    pub(crate) fn record(self, space: Space, key: u64, rec: Record) {
        self.0.record(space, key, rec)
    }
}

/// First use: what a launch or a module's lookup may make the driver take at first use (lazy loading, stack
/// growth), and what a context's end takes back.
#[derive(Clone, Copy)]
pub(crate) struct FirstUseCalls<'a>(&'a Memory);

impl<'a> FirstUseCalls<'a> {
    /// Whether a launch may take memory at first use (two relaxed loads).
    #[inline(always)]
    pub(crate) fn armed(self) -> bool {
        self.0.first_use.armed()
    }

    /// Before a launch of `f` on `stream`: `false` = refused (see `FirstUse::first_launch_to`).
    #[inline(always)]
    pub(crate) fn launch_to(
        self,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        how: Use,
        f: usize,
        stream: usize,
        slot: &mut Option<Launch<'a>>,
    ) -> bool {
        FirstUse::first_launch_to(self.0, cuda, nvml, how, f, stream, slot)
    }

    /// The launch `l` let through returned `r`.
    #[inline(always)]
    pub(crate) fn launched(self, cuda: &CudaTable, nvml: &Nvml, l: Launch<'_>, stream: usize, r: CUresult) {
        self.0.first_use.launched(self.0, cuda, nvml, l, stream, r)
    }

    /// A lookup that may load `owner`'s code at first use (see `FirstUse::lookup`).
    #[inline(always)]
    pub(crate) fn lookup(
        self,
        cuda: &CudaTable,
        nvml: &Nvml,
        owner: Owner,
        call: impl FnOnce() -> CUresult,
        handle: impl Fn() -> Option<usize>,
    ) -> CUresult {
        self.0.first_use.lookup(self.0, cuda, nvml, owner, call, handle)
    }

    /// The last context on `dev` is gone: the allocations made in it go (see
    /// `Memory::forget_context_allocations`).
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn context_gone(self, cuda: &CudaTable, dev: Dev) {
        self.0.forget_context_allocations(cuda, dev)
    }
}

/// Overhead: what contexts and modules cost, and the host pid NVML knows this process by.
#[derive(Clone, Copy)]
pub(crate) struct OverheadCalls<'a>(&'a Memory);

impl<'a> OverheadCalls<'a> {
    /// `call`, a creation, load, unload, destroy, release or limit (see `Overhead::call`).
    #[inline(always)]
    pub(crate) fn call(
        self,
        cuda: &CudaTable,
        nvml: &Nvml,
        what: OverheadCall<'_>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.0.overhead.call(self.0, cuda, nvml, what, call)
    }

    /// Before the driver creates `what`: its estimate reserved (see `Overhead::creating`).
    #[cfg(test)]
    #[inline(always)]
    pub(crate) fn creating(
        self,
        cuda: &'a CudaTable,
        nvml: &'a Nvml,
        what: Creation,
    ) -> Result<Creating<'a>, OverCap> {
        self.0.overhead.creating(self.0, cuda, nvml, what)
    }

    /// The host pid NVML knows this process by, once learned.
    #[inline(always)]
    pub(crate) fn host_pid(self) -> Option<u32> {
        self.0.host_pid()
    }
}

impl Memory {
    /// The allocation family.
    #[inline(always)]
    pub(crate) fn allocs(&self) -> AllocCalls<'_> {
        AllocCalls(self)
    }

    /// The first-use family.
    #[inline(always)]
    pub(crate) fn first_use(&self) -> FirstUseCalls<'_> {
        FirstUseCalls(self)
    }

    /// The overhead family.
    #[inline(always)]
    pub(crate) fn overhead(&self) -> OverheadCalls<'_> {
        OverheadCalls(self)
    }
}
