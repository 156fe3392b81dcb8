//! The allocation family: the ledger of live objects, the bytes this process charged for them, the credit
//! charged ahead, and the admission of an allocation against the cap and a device's reservation. It owns that
//! state; the usage file and the policy come from the `Devices` it holds, the overhead counters (what the
//! usage file must keep charged besides allocations) are passed in, and what admission asks beyond the file
//! (a device's free memory, the reconciliation near the cap) is passed in as closures.

use super::driver::Driver;
use super::ledger::{Kind, Ledger, Record, Space};
use super::{credit, reserve, usage_ok, Admitted, OverCap, PerDevice};
use crate::devices::{Dev, Devices};
use crate::ffi::cuda::CUresult;
use crate::log::{log, Level};
use cuquota_core::{DeviceId, UsageRegion};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A device's memory cap and the memory its limits keep for high-priority tenants (`None`: none).
pub(super) type Limits = (Option<u64>, Option<u64>);

/// Live allocations, their charge and the credit ahead of them.
pub(super) struct Allocs {
    devices: Arc<Devices>,
    /// Live allocations of this process.
    ledger: Ledger,
    /// Bytes this process has charged for allocations (not overhead), per device entry.
    bytes: PerDevice,
    /// Bytes charged ahead of allocations, per device entry.
    credit: credit::Credit,
}

impl Allocs {
    pub(super) fn new(devices: Arc<Devices>) -> Allocs {
        Allocs {
            devices,
            ledger: Ledger::new(),
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            credit: credit::Credit::default(),
        }
    }

    /// The ledger (VMM, pools and IPC record and look up their objects in it).
    #[inline(always)]
    pub(super) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn usage(&self) -> &UsageRegion {
        self.devices.usage()
    }

    /// Bytes of allocations this process has charged on entry `id` (overhead excluded).
    #[inline(always)]
    pub(super) fn allocated(&self, id: DeviceId) -> u64 {
        self.bytes[id.index()].load(Ordering::Relaxed)
    }

    /// The fast half of an admission of `bytes` on `dev`: under a cap without a reservation, taken from this
    /// process's credit. `Err`: the device's limits (cap, reservation), for [`Allocs::admit_charged`].
    #[inline(always)]
    pub(super) fn admit_credit(
        &self,
        overhead: &PerDevice,
        dev: Dev,
        bytes: u64,
    ) -> Result<Admitted<'_>, Limits> {
        let (limit, reserved) = self.devices.memory_limits(dev);
        if let (Some(_), None) = (limit, reserved) {
            if self.credit.on_under(dev.id.index(), self.devices.limits_gen())
                && self.take_credit(dev, bytes, limit)
            {
                self.bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
                self.hami_publish(overhead, dev.id);
                return Ok(Admitted(None));
            }
        }
        Err((limit, reserved))
    }

    /// `bytes` from this process's credit on `dev`, with the usage file's tamper check (it fails closed here as
    /// on the charged path).
    #[inline(always)]
    fn take_credit(&self, dev: Dev, bytes: u64, limit: Option<u64>) -> bool {
        let u = self.usage();
        match u.cached_slot() {
            Some(slot) => usage_ok(u, limit).is_ok() && u.take_credit(slot, dev.id, bytes),
            None => false,
        }
    }

    /// An admission of `bytes` on `dev` past the credit, under `limits` (see [`Allocs::admit_credit`]): the
    /// credit goes back, the slot is charged and the container summed, and far from the cap a chunk is charged
    /// ahead (`credit`). What it asks beyond the usage file is passed in: `near_cap(cap, used)`, the check an
    /// admission under `cap` makes once charged, the container then at `used` (the reconciliation near the
    /// cap); `free(dev, uuid)`, the device's free memory, when its limits keep memory for high-priority tenants.
    /// `Err` = refused: nothing charged.
    #[inline(always)]
    pub(super) fn admit_charged(
        &self,
        overhead: &PerDevice,
        dev: Dev,
        bytes: u64,
        (limit, reserved): Limits,
        free: impl FnOnce(Dev, Option<[u8; 16]>) -> Option<u64>,
        near_cap: impl FnOnce(u64, u64) -> Result<(), OverCap>,
    ) -> Result<Admitted<'_>, OverCap> {
        if limit.is_some() {
            self.give_back_credit(dev);
        }
        let used = self.charge_cap(overhead, dev, bytes, limit)?;
        if let Some(cap) = limit {
            if near_cap(cap, used).is_err() {
                self.release(overhead, dev.id, bytes);
                self.usage().count_refusal(dev.id);
                return Err(OverCap);
            }
        }
        match (reserved, limit) {
            (Some(reserved), _) => self.admit_reserved(overhead, dev, bytes, reserved, free),
            (None, Some(cap)) => {
                if credit::far_from_cap(cap, used) && self.credit.wants_chunk(dev.id.index(), bytes) {
                    self.charge_ahead(dev, cap);
                }
                Ok(Admitted(None))
            }
            (None, None) => Ok(Admitted(None)),
        }
    }

    /// Charges a chunk of credit on `dev` under `cap` (nothing when it does not fit, or when an admission near
    /// the cap turned credit off meanwhile).
    fn charge_ahead(&self, dev: Dev, cap: u64) {
        let Some(slot) = self.usage().cached_slot() else {
            return;
        };
        let i = dev.id.index();
        let offs = self.credit.offs(i);
        if !self.usage().charge_credit(slot, dev.id, credit::CHUNK, cap) {
            return;
        }
        // The chunk was judged against `cap`: on only under limits that still say `cap` (a changed limits
        // file seen by another thread meanwhile bumped the generation read here, or changes the cap read after).
        let gen = self.devices.limits_gen();
        if self.devices.memory_cap(dev) != Some(cap) || !self.credit.on_after(i, gen, offs) {
            self.credit.off(i);
            self.usage().drain_credit(slot, dev.id);
        }
    }

    /// The part of [`Allocs::admit_charged`] for a device whose limits keep `reserved` bytes for high-priority tenants
    /// (out of line: the capped path does not carry it).
    #[inline(never)]
    fn admit_reserved(
        &self,
        overhead: &PerDevice,
        dev: Dev,
        bytes: u64,
        reserved: u64,
        free: impl FnOnce(Dev, Option<[u8; 16]>) -> Option<u64>,
    ) -> Result<Admitted<'_>, OverCap> {
        let Some(e) = self.devices.priority_entry(dev) else {
            log!(
                Level::Error,
                "device {}: {reserved} bytes are reserved for high-priority tenants but there is no priority \
                 file to coordinate through: allocation refused",
                dev.ordinal
            );
            self.release(overhead, dev.id, bytes);
            return Err(OverCap);
        };
        let uuid = self.devices.uuid_of(dev.ordinal);
        match reserve::check(e, bytes, reserved, || free(dev, uuid)) {
            Ok(a) => Ok(Admitted(Some(a))),
            Err(why) => {
                log!(
                    Level::Debug,
                    "refused {bytes} bytes on device {}: {why:?} ({reserved} bytes kept for high priority)",
                    dev.ordinal
                );
                self.release(overhead, dev.id, bytes);
                self.usage().count_refusal(dev.id);
                Err(OverCap)
            }
        }
    }

    /// The container-cap part of [`Allocs::admit_charged`]: the container's usage of `dev` after the charge (0 without
    /// a limit).
    fn charge_cap(
        &self,
        overhead: &PerDevice,
        dev: Dev,
        bytes: u64,
        limit: Option<u64>,
    ) -> Result<u64, OverCap> {
        let slot = match self.usage().process_slot() {
            Ok(s) => s,
            Err(e) => {
                log!(Level::Error, "no process slot in the usage region: {e}");
                // Fail closed when a limit applies; without one, allocating unaccounted harms no one.
                return if limit.is_some() { Err(OverCap) } else { Ok(0) };
            }
        };
        // What this process holds stays charged even if another process zeroed the file.
        self.usage().reassert(slot, |id| {
            self.allocated(id) + overhead[id.index()].load(Ordering::Relaxed)
        });
        match self.usage().charge(slot, dev.id, bytes, limit) {
            // Checked once, after the charge: a file truncated, zeroed or replaced before it or while it ran
            // (the charge itself may be what faulted: a truncated file's zero pages admit anything) is refused
            // here, and the charge taken back.
            Ok(_) if usage_ok(self.usage(), limit).is_err() => {
                self.usage().uncharge(slot, dev.id, bytes);
                Err(OverCap)
            }
            Ok(used) => {
                self.bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
                self.hami_publish(overhead, dev.id);
                Ok(used)
            }
            Err(e) => {
                log!(
                    Level::Debug,
                    "refused {bytes} bytes on device {}: {e}",
                    dev.ordinal
                );
                self.usage().count_refusal(dev.id);
                Err(OverCap)
            }
        }
    }

    /// Charges `bytes` whatever the limit (the driver already handed the memory out).
    pub(super) fn force(&self, overhead: &PerDevice, dev: Dev, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Ok(slot) = self.usage().process_slot() {
            let _ = self.usage().try_charge(slot, dev.id, bytes, None);
            self.bytes[dev.id.index()].fetch_add(bytes, Ordering::Relaxed);
            self.hami_publish(overhead, dev.id);
        }
    }

    /// Gives back `bytes` charged on device entry `id` (a free's path: inlined).
    #[inline(always)]
    pub(super) fn release(&self, overhead: &PerDevice, id: DeviceId, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let held = self.bytes[id.index()]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            })
            .unwrap_or_else(|v| v);
        if let Some(slot) = self.usage().cached_slot() {
            // Only bytes this process had allocated become credit; the rest is uncharged as before.
            let freed = held.min(bytes);
            let kept = self.credit.on(id.index()) && self.usage().give_credit(slot, id, freed, credit::CHUNK);
            let uncharge = if kept { bytes - freed } else { bytes };
            if uncharge != 0 {
                self.usage().uncharge(slot, id, uncharge);
            }
        }
        self.hami_publish(overhead, id);
    }

    /// This process no longer holds `bytes` on `id` whose charge it had moved to the shared table.
    pub(super) fn forget(&self, overhead: &PerDevice, id: DeviceId, bytes: u64) {
        let _ = self.bytes[id.index()].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
        self.hami_publish(overhead, id);
    }

    /// A key the driver handed out again still had a record: its old object was freed behind our back (a path
    /// we do not hook, or a context that died while others lived), so its charge goes back instead of leaking.
    #[inline(always)]
    pub(super) fn release_stale(&self, overhead: &PerDevice, stale: Option<Record>) {
        if let Some(Record {
            entry,
            bytes,
            kind: Kind::Direct,
        }) = stale
        {
            self.release_cold(overhead, entry, bytes);
        }
    }

    /// [`Allocs::release`] out of line (a stale record: rare).
    #[inline(never)]
    fn release_cold(&self, overhead: &PerDevice, id: DeviceId, bytes: u64) {
        self.release(overhead, id, bytes);
    }

    /// HAMi's file shows this process's figures on `id` (docs/hami.md): relaxed stores, no syscall.
    #[inline]
    pub(super) fn hami_publish(&self, overhead: &PerDevice, id: DeviceId) {
        let i = id.index();
        self.devices
            .hami_publish(id, self.allocated(id), overhead[i].load(Ordering::Relaxed));
    }

    /// Turns this process's credit off everywhere and takes it back from its slot (at exit, before the slot
    /// is given back).
    pub(super) fn give_back_all_credit(&self) {
        self.credit.close();
        for dev in self.devices.known().map(|(d, _)| d) {
            self.give_back_credit(dev);
        }
    }

    /// Turns this process's credit on `dev` off and takes it back from its slot (before an exact admission or
    /// a reconciliation).
    pub(super) fn give_back_credit(&self, dev: Dev) {
        // Off (and the turn-off counted) even when not on: a chunk being charged meanwhile stays off.
        self.credit.off(dev.id.index());
        if let Some(slot) = self.usage().cached_slot() {
            self.usage().drain_credit(slot, dev.id);
        }
    }

    /// Takes out of the ledger every record `gone(space, key, record)` says the driver freed (slow: a scan, each
    /// record held while `gone` looks at it) and gives back what they charged: a record `elsewhere` takes is its
    /// business (an export, whose charge may live in the shared table); a pool allocation's charge is its
    /// pool's (`pooled` is told its pool key); a plain allocation's goes back here.
    pub(super) fn forget_where(
        &self,
        overhead: &PerDevice,
        gone: impl Fn(Space, u64, &Record) -> bool,
        mut elsewhere: impl FnMut(Space, u64, Record) -> bool,
        mut pooled: impl FnMut(usize),
    ) {
        for (space, key, rec) in self.ledger.remove_where(gone) {
            if elsewhere(space, key, rec) {
                continue;
            }
            match rec.kind {
                Kind::Direct => self.release(overhead, rec.entry, rec.bytes),
                Kind::Pool(pool) => pooled(pool),
            }
        }
    }

    /// Forgets everything after `fork` in the child (the parent keeps its charges).
    pub(super) fn reset(&self) {
        self.ledger.clear();
        for a in &self.bytes {
            a.store(0, Ordering::Relaxed);
        }
        self.credit.reset();
    }
}

/// Whether the driver answers that no allocation starts at `p` any more (its range starts elsewhere, or it
/// knows no such address).
pub(super) fn freed_by(d: &impl Driver, p: u64) -> bool {
    match d.range_start(p) {
        Ok(start) => start != p,
        Err(r) => r == CUresult::ERROR_INVALID_VALUE,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{device_under, uuid_table, TempRegion};
    use super::*;
    use cuquota_core::Policy;
    use std::cell::Cell;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// Allocations on device 0 of a fresh usage file under `policy`, and no overhead charged.
    fn setup(policy: Policy) -> (TempRegion, Allocs, Dev, PerDevice) {
        let (t, devices, dev) = device_under("allocs", policy, &uuid_table());
        (
            t,
            Allocs::new(devices),
            dev,
            std::array::from_fn(|_| AtomicU64::new(0)),
        )
    }

    fn capped(cap: u64) -> Policy {
        Policy {
            memory: Some(cap),
            ..Policy::NONE
        }
    }

    /// An admission as `Memory::admit` makes it: from the credit, else charged.
    fn admit<'a>(
        a: &'a Allocs,
        o: &PerDevice,
        dev: Dev,
        bytes: u64,
        free: impl FnOnce(Dev, Option<[u8; 16]>) -> Option<u64>,
        near_cap: impl FnOnce(u64, u64) -> Result<(), OverCap>,
    ) -> Result<Admitted<'a>, OverCap> {
        match a.admit_credit(o, dev, bytes) {
            Ok(admitted) => Ok(admitted),
            Err(limits) => a.admit_charged(o, dev, bytes, limits, free, near_cap),
        }
    }

    fn no_free(_: Dev, _: Option<[u8; 16]>) -> Option<u64> {
        panic!("asked for the device's free memory without a reservation")
    }

    fn used(a: &Allocs, dev: Dev) -> u64 {
        a.usage().container_used(dev.id)
    }

    /// Under a cap an admission that does not fit is refused with nothing charged, and one that fits is charged
    /// to the usage file and to the process; a release gives it back. The near-cap check sees the container's
    /// usage after the charge, and its refusal takes the charge back.
    #[test]
    fn an_admission_over_the_cap_is_refused_and_a_near_cap_refusal_gives_its_charge_back() {
        let (_t, a, dev, o) = setup(capped(64 * MIB));
        let seen = Cell::new(None);
        let near = |cap, used| {
            seen.set(Some((cap, used)));
            Ok(())
        };
        assert!(admit(&a, &o, dev, 40 * MIB, no_free, near).is_ok());
        assert_eq!(seen.get(), Some((64 * MIB, 40 * MIB)));
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (40 * MIB, 40 * MIB));
        assert!(admit(&a, &o, dev, 30 * MIB, no_free, |_, _| Ok(())).is_err());
        assert_eq!(
            (used(&a, dev), a.allocated(dev.id)),
            (40 * MIB, 40 * MIB),
            "nothing charged"
        );
        assert!(admit(&a, &o, dev, 8 * MIB, no_free, |_, _| Err(OverCap)).is_err());
        assert_eq!(
            (used(&a, dev), a.allocated(dev.id)),
            (40 * MIB, 40 * MIB),
            "the charge went back"
        );
        a.release(&o, dev.id, 40 * MIB);
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (0, 0));
        // Control: the same 30 MiB fit once the room is there.
        assert!(admit(&a, &o, dev, 30 * MIB, no_free, |_, _| Ok(())).is_ok());
        assert_eq!(used(&a, dev), 30 * MIB);
    }

    /// Far from the cap, small admissions past `SMALL_BEFORE_CREDIT` charge a chunk ahead: later ones take from
    /// it (the near-cap check is not reached) and the container's figure does not move; frees go back into
    /// it; giving the credit back leaves exactly what the process holds charged.
    #[test]
    fn small_admissions_far_from_the_cap_take_from_credit_that_goes_back_on_demand() {
        let (_t, a, dev, o) = setup(capped(8 * GIB));
        let n = u64::from(credit::SMALL_BEFORE_CREDIT) + 1;
        for _ in 0..n {
            assert!(admit(&a, &o, dev, MIB, no_free, |_, _| Ok(())).is_ok());
        }
        assert_eq!(a.allocated(dev.id), n * MIB);
        assert_eq!(used(&a, dev), n * MIB + credit::CHUNK, "a chunk charged ahead");
        let checks = Cell::new(0);
        let near = |_, _| {
            checks.set(checks.get() + 1);
            Ok(())
        };
        assert!(admit(&a, &o, dev, MIB, no_free, near).is_ok());
        assert_eq!(checks.get(), 0, "taken from the credit");
        assert_eq!(
            used(&a, dev),
            n * MIB + credit::CHUNK,
            "the container's figure unchanged"
        );
        assert_eq!(a.allocated(dev.id), (n + 1) * MIB);
        a.release(&o, dev.id, MIB);
        assert_eq!(
            used(&a, dev),
            n * MIB + credit::CHUNK,
            "the free went back into the credit"
        );
        a.give_back_credit(dev);
        assert_eq!(used(&a, dev), n * MIB);
        assert_eq!(a.allocated(dev.id), n * MIB);
        // Credit off: the next admission is charged and checked near the cap, then charges a chunk ahead again.
        assert!(admit(&a, &o, dev, MIB, no_free, near).is_ok());
        assert_eq!(checks.get(), 1);
        assert_eq!(used(&a, dev), (n + 1) * MIB + credit::CHUNK);
    }

    /// A device whose limits keep memory for high-priority tenants, with no priority file to coordinate
    /// through, refuses (fails closed) before asking the driver, nothing charged. Without any limit nothing is
    /// checked, but the charge is counted.
    #[test]
    fn a_reservation_without_its_file_refuses_and_no_limit_admits_anything() {
        let (_t, a, dev, o) = setup(Policy {
            reserved_memory: Some(GIB),
            ..Policy::NONE
        });
        assert!(admit(&a, &o, dev, MIB, no_free, |_, _| Ok(())).is_err());
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (0, 0));
        let (_t, a, dev, o) = setup(Policy::NONE);
        let near = |_, _| panic!("a near-cap check without a cap");
        assert!(admit(&a, &o, dev, 100 * GIB, no_free, near).is_ok());
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (100 * GIB, 100 * GIB));
    }

    /// `force` charges past the cap; a stale record's charge goes back (a pool's record is not this family's
    /// to give back); a forgotten charge leaves the process's figure but not the file; `reset` forgets all.
    #[test]
    fn force_ignores_the_cap_and_stale_or_forgotten_charges_leave_the_process() {
        let (_t, a, dev, o) = setup(capped(64 * MIB));
        a.force(&o, dev, 100 * MIB);
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (100 * MIB, 100 * MIB));
        let rec = |kind| Record {
            entry: dev.id,
            bytes: 10 * MIB,
            kind,
        };
        a.release_stale(&o, Some(rec(Kind::Pool(7))));
        assert_eq!(used(&a, dev), 100 * MIB, "a pool's record: untouched");
        a.release_stale(&o, Some(rec(Kind::Direct)));
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (90 * MIB, 90 * MIB));
        a.forget(&o, dev.id, 40 * MIB);
        assert_eq!((used(&a, dev), a.allocated(dev.id)), (90 * MIB, 50 * MIB));
        a.reset();
        assert_eq!(a.allocated(dev.id), 0);
    }

    /// Records the driver freed leave the ledger: a plain allocation's charge goes back, an export's is left
    /// to whoever took it, a pool allocation's to its pool; records not named stay.
    #[test]
    fn forgotten_records_give_back_only_the_charges_this_family_holds() {
        let (_t, a, dev, o) = setup(capped(64 * MIB));
        let rec = |kind| Record {
            entry: dev.id,
            bytes: 10 * MIB,
            kind,
        };
        a.force(&o, dev, 30 * MIB);
        a.ledger().insert(Space::Pointer, 0x100, rec(Kind::Direct));
        a.ledger().insert(Space::Pointer, 0x200, rec(Kind::Direct));
        a.ledger().insert(Space::Pointer, 0x300, rec(Kind::Pool(7)));
        a.ledger().insert(Space::Vmm, 0x400, rec(Kind::Direct));
        let pooled = std::cell::RefCell::new(Vec::new());
        a.forget_where(
            &o,
            |space, _, _| space == Space::Pointer,
            |_, key, _| key == 0x200,
            |pool| pooled.borrow_mut().push(pool),
        );
        assert_eq!(a.allocated(dev.id), 20 * MIB, "only 0x100's charge went back");
        assert_eq!(*pooled.borrow(), [7]);
        assert!(a.ledger().get(Space::Pointer, 0x100).is_none());
        assert!(a.ledger().get(Space::Vmm, 0x400).is_some(), "not named: kept");
    }

    /// Only the driver's "no allocation there" forgets a record; an answer it cannot give keeps it.
    #[test]
    fn a_record_is_freed_by_the_driver_only_when_it_says_no_allocation_starts_there() {
        let d = crate::memory::driver::fake::Fake::default();
        d.allocations.borrow_mut().insert(0x100, (0, 4096));
        d.unknown.borrow_mut().insert(0x200);
        assert!(!freed_by(&d, 0x100), "still allocated there");
        assert!(freed_by(&d, 0x200), "the driver knows no such address");
        assert!(!freed_by(&d, 0x300), "refused: kept (over-count, never under)");
    }
}
