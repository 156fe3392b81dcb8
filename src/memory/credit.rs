//! A process's credit on each device: bytes charged on its usage slot ahead of its allocations, so that an
//! admission far from the cap takes from process-local counters instead of charging the shared slot and summing
//! the container (the hot path of issue 22).
//!
//! The slot always holds at least what the process allocated plus its credit: credit grows only after the slot
//! was charged (a chunk taken by an admission far from the cap, or a free's bytes kept instead of uncharged),
//! and shrinks before the slot is uncharged. Other processes therefore see the credit as used: a process holds at
//! most [`MAX`] of it per device, and none near the cap — an admission that lands within the reconciliation's
//! margin plus a chunk of the cap gives its credit back and turns credit off, so from there on every admission
//! of the process is charged and reconciled exactly, and every free goes straight back to the container. What
//! the credit costs the container (docs/interception.md, "Credit"): other processes' unused credit, at most
//! [`MAX`] each, counts against the cap (a refusal up to that much early), and the driver's figure near the cap
//! is consulted at the first admission of a process past its credit, not before.

use super::reconcile::margin;
use cuquota_core::region::layout::MAX_DEVICES;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes charged ahead at once.
pub(crate) const CHUNK: u64 = 16 << 20;
/// Most credit a process keeps on a device after frees; above it the excess over one chunk goes back.
pub(crate) const MAX: u64 = 2 * CHUNK;
/// Admissions smaller than a chunk a process makes on a device past its credit before it charges ahead: a
/// program that allocates a few large blocks (most of them) gains nothing from credit and keeps its charge
/// exact; one that allocates many small ones stops paying the shared charge on each.
pub(crate) const SMALL_BEFORE_CREDIT: u32 = 8;

/// What a free does with its bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Give {
    /// Kept as credit: the slot stays charged.
    Kept,
    /// Kept, and this much credit above one chunk is to be uncharged from the slot.
    Return(u64),
    /// No credit on the device: uncharge the bytes.
    Off,
}

/// The credit of this process, per device entry (indexed as `DeviceId::index`).
pub(crate) struct Credit {
    bytes: [AtomicU64; MAX_DEVICES],
    /// The cap the credit was charged under (0: credit off). An admission under another cap (the agent changed
    /// the limit) does not take from it.
    cap: [AtomicU64; MAX_DEVICES],
    /// Admissions smaller than a chunk made past the credit (saturating at [`SMALL_BEFORE_CREDIT`]).
    small: [AtomicU32; MAX_DEVICES],
}

impl Default for Credit {
    fn default() -> Credit {
        Credit {
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            cap: std::array::from_fn(|_| AtomicU64::new(0)),
            small: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl Credit {
    /// Takes `bytes` from the credit on `id` if it was charged under `cap` and holds that much.
    #[inline]
    pub(crate) fn take(&self, i: usize, bytes: u64, cap: u64) -> bool {
        self.cap[i].load(Ordering::Relaxed) == cap
            && self.bytes[i]
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(bytes))
                .is_ok()
    }

    /// A free of `bytes` on `id` (already counted out of the process's allocations).
    #[inline]
    pub(crate) fn give(&self, i: usize, bytes: u64) -> Give {
        if self.cap[i].load(Ordering::Relaxed) == 0 {
            return Give::Off;
        }
        if self.bytes[i].fetch_add(bytes, Ordering::Relaxed) + bytes <= MAX {
            return Give::Kept;
        }
        self.trim(i)
    }

    #[cold]
    #[inline(never)]
    fn trim(&self, i: usize) -> Give {
        match self.bytes[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
            (c > MAX).then_some(CHUNK)
        }) {
            Ok(prev) => Give::Return(prev - CHUNK),
            Err(_) => Give::Kept,
        }
    }

    /// Turns credit on `id` off and takes all of it: the bytes to uncharge from the slot.
    pub(crate) fn drain(&self, i: usize) -> u64 {
        self.cap[i].store(0, Ordering::Relaxed);
        self.bytes[i].swap(0, Ordering::Relaxed)
    }

    /// An admission of `bytes` past the credit: whether the process should charge a chunk ahead (it has made
    /// [`SMALL_BEFORE_CREDIT`] admissions smaller than a chunk on the device).
    pub(crate) fn wants_chunk(&self, i: usize, bytes: u64) -> bool {
        if bytes >= CHUNK {
            return false;
        }
        let n = self.small[i].load(Ordering::Relaxed);
        if n >= SMALL_BEFORE_CREDIT {
            return true;
        }
        self.small[i].store(n + 1, Ordering::Relaxed);
        false
    }

    /// Adds a chunk the slot was just charged with, under `cap`.
    pub(crate) fn grant(&self, i: usize, cap: u64) {
        self.bytes[i].fetch_add(CHUNK, Ordering::Relaxed);
        self.cap[i].store(cap, Ordering::Relaxed);
    }

    /// Credit held on `id` (what the slot holds beyond the process's allocations and overhead).
    pub(crate) fn held(&self, i: usize) -> u64 {
        self.bytes[i].load(Ordering::Relaxed)
    }

    /// Forgets all credit (a forked child: the slot that held it is the parent's).
    pub(crate) fn reset(&self) {
        for ((b, c), n) in self.bytes.iter().zip(&self.cap).zip(&self.small) {
            c.store(0, Ordering::Relaxed);
            b.store(0, Ordering::Relaxed);
            n.store(0, Ordering::Relaxed);
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
    fn takes_only_what_it_holds_under_the_same_cap() {
        let c = Credit::default();
        assert!(!c.take(D, 1, CAP), "no credit before a grant");
        c.grant(D, CAP);
        assert!(c.take(D, CHUNK - 1, CAP));
        assert!(!c.take(D, 2, CAP), "one byte left");
        assert!(c.take(D, 1, CAP));
        c.grant(D, CAP);
        assert!(!c.take(D, 1, CAP / 2), "granted under another cap");
        assert_eq!(c.held(D), CHUNK);
    }

    #[test]
    fn frees_keep_at_most_max_and_return_the_rest() {
        let c = Credit::default();
        assert_eq!(c.give(D, 5), Give::Off, "credit off: uncharge");
        c.grant(D, CAP);
        assert_eq!(c.give(D, CHUNK), Give::Kept);
        assert_eq!(c.held(D), MAX);
        assert_eq!(c.give(D, 3 * CHUNK), Give::Return(4 * CHUNK));
        assert_eq!(c.held(D), CHUNK);
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
    }

    #[test]
    fn drain_turns_credit_off() {
        let c = Credit::default();
        c.grant(D, CAP);
        assert_eq!(c.drain(D), CHUNK);
        assert_eq!(c.held(D), 0);
        assert_eq!(c.give(D, 7), Give::Off);
        assert!(!c.take(D, 0, CAP), "credit off");
    }

    #[test]
    fn a_chunk_only_clear_of_the_margin() {
        let m = margin(CAP);
        assert!(far_from_cap(CAP, CAP - m - CHUNK));
        assert!(!far_from_cap(CAP, CAP - m - CHUNK + 1));
        assert!(!far_from_cap(CAP, CAP + 1));
    }
}
