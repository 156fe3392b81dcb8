//! When a process charges ahead of its allocations (credit), so that an admission far from the cap takes from
//! its slot's credit word (one compare-and-swap on a word only it and a refused admission touch) instead of
//! charging the slot and summing the container: the hot path of issue 22. The credit's bytes live in the usage
//! file (`UsageSlot::credit`, core's `UsageRegion::take_credit` and siblings): they are charged, so the
//! container's total always includes them; readers report them as free (`UsageRegion::container_held`); and an
//! admission about to be refused at the cap, or a reconciliation that finds the container over it, takes every
//! process's credit back first (credit is not memory anyone holds). This module keeps the process's side:
//! whether it takes credit on a device and under which cap, and when it starts to. docs/interception.md,
//! "Credit".

use super::reconcile::margin;
use cuquota_core::region::layout::MAX_DEVICES;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Bytes charged ahead at once (the usage file's credit words hold at most `CREDIT_MAX`, twice this: above it
/// a free's excess over one chunk goes back).
pub(crate) const CHUNK: u64 = 16 << 20;
const _: () = assert!(2 * CHUNK == cuquota_core::region::layout::CREDIT_MAX);
/// Admissions smaller than a chunk a process makes on a device past its credit before it charges ahead: a
/// program that allocates a few large blocks (most of them) gains nothing from credit and keeps its charge
/// exact; one that allocates many small ones stops paying the shared charge on each.
pub(crate) const SMALL_BEFORE_CREDIT: u32 = 8;

/// The process's credit state, per device entry (indexed as `DeviceId::index`).
pub(crate) struct Credit {
    /// 1 + the limits generation (`Devices::limits_gen`) the credit was charged under; 0: off. After any
    /// change of a limits file nothing is taken from it.
    cap: [AtomicU64; MAX_DEVICES],
    /// Admissions smaller than a chunk made past the credit (stops counting at [`SMALL_BEFORE_CREDIT`]).
    small: [AtomicU32; MAX_DEVICES],
    /// Turns off so far (a charge ahead that raced one turns itself off again).
    offs: [AtomicU64; MAX_DEVICES],
    /// No more credit (the process is exiting: its slot is about to be given back).
    closed: AtomicBool,
}

impl Default for Credit {
    fn default() -> Credit {
        Credit {
            cap: std::array::from_fn(|_| AtomicU64::new(0)),
            small: std::array::from_fn(|_| AtomicU32::new(0)),
            offs: std::array::from_fn(|_| AtomicU64::new(0)),
            closed: AtomicBool::new(false),
        }
    }
}

impl Credit {
    /// Whether admissions on `i` under limits generation `gen` take from the credit.
    #[inline]
    pub(crate) fn on_under(&self, i: usize, gen: u64) -> bool {
        self.cap[i].load(Ordering::Relaxed) == gen + 1
    }

    /// Whether frees on `i` give back to the credit.
    #[inline]
    pub(crate) fn on(&self, i: usize) -> bool {
        self.cap[i].load(Ordering::Relaxed) != 0
    }

    /// Turns credit on `i` off (the caller takes it back from the slot).
    pub(crate) fn off(&self, i: usize) {
        self.offs[i].fetch_add(1, Ordering::SeqCst);
        self.cap[i].store(0, Ordering::SeqCst);
    }

    /// The count of turns off, read before charging ahead.
    pub(crate) fn offs(&self, i: usize) -> u64 {
        self.offs[i].load(Ordering::SeqCst)
    }

    /// Turns credit on `i` on under limits generation `gen` after a chunk was charged; false when it was
    /// turned off since `offs_before` was read (a racing admission near the cap: the caller takes the credit
    /// back).
    pub(crate) fn on_after(&self, i: usize, gen: u64, offs_before: u64) -> bool {
        self.cap[i].store(gen + 1, Ordering::SeqCst);
        if self.offs[i].load(Ordering::SeqCst) != offs_before {
            self.cap[i].store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// An admission of `bytes` past the credit: whether the process should charge a chunk ahead (it has made
    /// [`SMALL_BEFORE_CREDIT`] admissions smaller than a chunk on the device).
    pub(crate) fn wants_chunk(&self, i: usize, bytes: u64) -> bool {
        if bytes >= CHUNK || self.closed.load(Ordering::Relaxed) {
            return false;
        }
        let n = self.small[i].load(Ordering::Relaxed);
        if n >= SMALL_BEFORE_CREDIT {
            return true;
        }
        self.small[i].store(n + 1, Ordering::Relaxed);
        false
    }

    /// No more credit: the process is exiting.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Forgets everything (a forked child, whose slot is new; a slot given back at exit).
    pub(crate) fn reset(&self) {
        for ((c, n), o) in self.cap.iter().zip(&self.small).zip(&self.offs) {
            c.store(0, Ordering::Relaxed);
            n.store(0, Ordering::Relaxed);
            o.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether an admission that left the container at `used` under `cap` may charge a chunk ahead: it stays clear
/// of the margin within which the driver's figure is consulted.
#[inline]
pub(crate) fn far_from_cap(cap: u64, used: u64) -> bool {
    cap.saturating_sub(used) >= margin(cap) + CHUNK
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: usize = 0;
    const CAP: u64 = 8 << 30;

    #[test]
    fn on_only_under_the_limits_it_was_charged_under() {
        let c = Credit::default();
        assert!(!c.on(D) && !c.on_under(D, 0));
        let o = c.offs(D);
        assert!(c.on_after(D, 7, o));
        assert!(c.on(D) && c.on_under(D, 7) && !c.on_under(D, 8));
        c.off(D);
        assert!(!c.on(D));
    }

    #[test]
    fn a_charge_ahead_that_raced_a_turn_off_stays_off() {
        let c = Credit::default();
        let o = c.offs(D);
        c.off(D);
        assert!(!c.on_after(D, 0, o));
        assert!(!c.on(D));
    }

    #[test]
    fn a_chunk_only_after_enough_small_admissions() {
        let c = Credit::default();
        for _ in 0..SMALL_BEFORE_CREDIT {
            assert!(!c.wants_chunk(D, 1 << 20));
            assert!(!c.wants_chunk(D, CHUNK), "a large admission does not count");
        }
        assert!(c.wants_chunk(D, 1 << 20));
        c.reset();
        assert!(!c.wants_chunk(D, 1 << 20), "a forked child starts over");
        for _ in 0..=SMALL_BEFORE_CREDIT {
            c.wants_chunk(D, 1 << 20);
        }
        c.close();
        assert!(!c.wants_chunk(D, 1 << 20), "none at exit");
    }

    #[test]
    fn a_chunk_only_clear_of_the_margin() {
        let m = margin(CAP);
        assert!(far_from_cap(CAP, CAP - m - CHUNK));
        assert!(!far_from_cap(CAP, CAP - m - CHUNK + 1));
        assert!(!far_from_cap(CAP, CAP + 1));
    }
}
