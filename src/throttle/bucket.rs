//! The GPU-time token bucket of one container on one device, kept in the usage region's `throttle[8]` words
//! so that every process of the container draws from the same bucket.
//!
//! Representation (GCRA, "generic cell rate algorithm"): one word holds `zero_at`, the wall time (CLOCK_MONOTONIC
//! ns) at which the bucket holds exactly zero tokens. At time `t` and rate `r` (GPU ns earned per wall ns) the
//! bucket holds `r × (t − zero_at)` GPU-ns, capped at `BURST_GPU_NS`. Spending `c` GPU-ns moves `zero_at` forward
//! by `c / r`. So a take is one CAS on one word, with no lock and no second word to keep consistent, and nothing a
//! dead process could hold. A launch may go when `zero_at ≤ now` (tokens ≥ 0); it then may leave the bucket in
//! debt by at most its own cost, which makes the caller after it wait `debt / r`.
//!
//! Why the cap is `BURST_GPU_NS` (8 ms of GPU time, i.e. a wall window of 8 ms / r): the burst the bucket allows
//! is that plus one kernel's debt, so in any 1 s window a container at L % gets at most L × 1 s + 8 ms + one
//! kernel (≤ 1.8 points for kernels up to 10 ms), whatever L. A low limit gets a long wall window (80 ms at
//! 10 %), so a process woken late by a busy CPU does not lose the time it was owed. A rate change (burst
//! controller, live limit) does not rewrite the word: the pending wait stays as committed, only future earning
//! changes.

use std::sync::atomic::{AtomicU64, Ordering};

/// Largest burst, in GPU time.
pub(crate) const BURST_GPU_NS: u64 = 8_000_000;
/// Longest single charge (guards against a nonsense estimate blocking a program for ever).
pub(crate) const MAX_COST_NS: u64 = 10_000_000_000;
/// Longest estimate or measurement kept for one launch (a nonsense measurement from a broken event pair is
/// clamped to it, and to the wall time since the launch). Longer than `MAX_COST_NS` is charged in instalments.
pub(crate) const MAX_MEASURE_NS: u64 = 86_400_000_000_000;
/// Rates are in per-mille of the device: 1000 = the whole device.
pub(crate) const FULL_RATE: u64 = 1000;

/// How far ahead of `now` a sound word can be at `rate_pm`: one charge of at most `MAX_COST_NS` taken while the
/// bucket was not in debt, plus one correction of at most `MAX_COST_NS`, plus the window. A word farther ahead was
/// not written by this algorithm at this rate: a dead or buggy process scribbled on it, the usage file outlived a
/// reboot (CLOCK_MONOTONIC restarts near 0, so every word of the previous boot lies in the future), or the limit was
/// raised since a huge debt was committed at the old rate. Such a word is reset to `now` (empty bucket, no debt)
/// rather than make every launch of the container wait for it — possibly for ever.
#[inline]
pub(crate) fn max_ahead_ns(rate_pm: u64) -> u64 {
    2 * span_ns(MAX_COST_NS, rate_pm) + window_ns(rate_pm)
}

/// Word indexes inside `throttle[8]`. Owned by `src/throttle`. (Word 5 is unused: the limits a process enforces
/// are the device entry's `limits`.)
pub(crate) mod slot {
    /// Wall time (ns) at which the bucket is empty; 0 = never used (full bucket).
    pub(crate) const ZERO_AT: usize = 0;
    /// Effective rate in per-mille set by the burst controller (0 = not set: use the configured limit).
    pub(crate) const EFF_RATE: usize = 1;
    /// Wall time of the last burst-controller sample (CAS elects the one process that samples).
    pub(crate) const SAMPLE_AT: usize = 2;
    /// The container's busy ns on this device at the last sample.
    pub(crate) const SAMPLE_OWN: usize = 3;
    /// The device's busy ns (all containers) at the last sample (its place in the layout; nothing reads it yet).
    #[allow(dead_code)]
    pub(crate) const SAMPLE_DEV: usize = 4;
    /// Burst controller state: bit 0 = others were active at the last sample.
    pub(crate) const BURST_STATE: usize = 6;
    /// Wall time of the last launch charged by any process of the container (status: "active").
    pub(crate) const LAST_LAUNCH: usize = 7;
}

/// Result of trying to take tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Charged; the launch may go.
    Granted,
    /// Bucket empty (in debt); try again at this wall time.
    WaitUntil(u64),
}

/// The bucket's wall window at `rate_pm`: the time it takes to earn `BURST_GPU_NS`.
#[inline]
pub(crate) fn window_ns(rate_pm: u64) -> u64 {
    span_ns(BURST_GPU_NS, rate_pm)
}

/// Wall-time span that `cost` GPU-ns represents at `rate` per-mille.
#[inline]
pub(crate) fn span_ns(cost: u64, rate_pm: u64) -> u64 {
    let rate = rate_pm.clamp(1, FULL_RATE);
    // u128: cost up to 10 s × 1000 does not overflow u64 either, but be safe for any caller.
    ((cost.min(MAX_COST_NS) as u128 * FULL_RATE as u128 + rate as u128 / 2) / rate as u128) as u64
}

/// A view of one container's bucket for one device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bucket<'a> {
    words: &'a [AtomicU64; 8],
}

impl<'a> Bucket<'a> {
    /// Wrap the region's `throttle[8]` words of one device entry.
    pub(crate) fn new(words: &'a [AtomicU64; 8]) -> Self {
        Bucket { words }
    }

    /// Take `cost` GPU-ns at `rate_pm` if the bucket is not in debt. One CAS in the common case.
    #[inline]
    pub(crate) fn try_take(&self, now: u64, cost: u64, rate_pm: u64) -> Take {
        let w = &self.words[slot::ZERO_AT];
        let mut z = w.load(Ordering::Acquire);
        loop {
            if z > now {
                if z - now <= max_ahead_ns(rate_pm) {
                    return Take::WaitUntil(z);
                }
                // Not a debt this algorithm can have left (see `max_ahead_ns`): start over from an empty bucket.
                match w.compare_exchange(z, now, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => z = now,
                    Err(cur) => z = cur,
                }
                continue;
            }
            let floor = now.saturating_sub(window_ns(rate_pm));
            let new = z.max(floor).saturating_add(span_ns(cost, rate_pm));
            match w.compare_exchange_weak(z, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Take::Granted,
                Err(cur) => z = cur,
            }
        }
    }

    /// [`Bucket::try_take`] for a launch that waited: it goes only once the bucket holds `need` GPU-ns (at
    /// most `BURST_GPU_NS`, so the wait ends), and then takes as `try_take` does. Waiting longer never earns
    /// more: the word moves by the launch's cost alone.
    pub(crate) fn try_take_holding(&self, now: u64, cost: u64, rate_pm: u64, need: u64) -> Take {
        match self.holds_at(now, rate_pm, need) {
            t if t > now => Take::WaitUntil(t),
            _ => self.try_take(now, cost, rate_pm),
        }
    }

    /// The earliest time from `now` at which the bucket holds `need` GPU-ns (`need` above `BURST_GPU_NS` counts
    /// as a full bucket); `now` when it already does. A word no charge could have left is left to `try_take`.
    pub(crate) fn holds_at(&self, now: u64, rate_pm: u64, need: u64) -> u64 {
        let z = self.words[slot::ZERO_AT].load(Ordering::Acquire);
        if z > now && z - now > max_ahead_ns(rate_pm) {
            return now;
        }
        let full = z.max(now.saturating_sub(window_ns(rate_pm)));
        full.saturating_add(span_ns(need.min(BURST_GPU_NS), rate_pm))
            .max(now)
    }

    /// When the bucket is in debt at `now`, the time it is out of it; `None` = a launch may go. A word
    /// farther ahead than this algorithm leaves (see [`max_ahead_ns`]) is reset to `now`.
    #[inline]
    pub(crate) fn wait_until(&self, now: u64, rate_pm: u64) -> Option<u64> {
        let w = &self.words[slot::ZERO_AT];
        let z = w.load(Ordering::Acquire);
        if z <= now {
            return None;
        }
        if z - now <= max_ahead_ns(rate_pm) {
            return Some(z);
        }
        let _ = w.compare_exchange(z, now, Ordering::AcqRel, Ordering::Acquire);
        None
    }

    /// Charge without waiting (work that already went to the device, or burst mode with the device to
    /// ourselves). `forgive` keeps the bucket from going into debt (tokens clamp at zero).
    pub(crate) fn charge(&self, now: u64, cost: u64, rate_pm: u64, forgive: bool) {
        let w = &self.words[slot::ZERO_AT];
        let mut z = w.load(Ordering::Acquire);
        loop {
            let floor = now.saturating_sub(window_ns(rate_pm));
            let mut new = z.max(floor).saturating_add(span_ns(cost, rate_pm));
            if forgive {
                new = new.min(now);
            }
            match w.compare_exchange_weak(z, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(cur) => z = cur,
            }
        }
    }

    /// Debits up to `cost` GPU-ns that already ran (a measurement above its charge, a debt's instalment) and
    /// returns how much went in: never more than leaves the word one maximal charge (`MAX_COST_NS`) ahead of
    /// `now`, so a sound word stays within [`max_ahead_ns`] (a launch's own charge comes on top only when the
    /// bucket is not in debt). The caller keeps the rest and pays it as the bucket drains.
    pub(crate) fn debit(&self, now: u64, cost: u64, rate_pm: u64) -> u64 {
        self.debit_within(now, cost, rate_pm, MAX_COST_NS)
    }

    /// [`Bucket::debit`], leaving the word at most `lead` GPU-ns ahead of `now` (at most `2 × MAX_COST_NS`, so
    /// a sound word stays within [`max_ahead_ns`]).
    pub(crate) fn debit_within(&self, now: u64, cost: u64, rate_pm: u64, lead: u64) -> u64 {
        let lead_max = lead.min(2 * MAX_COST_NS);
        let w = &self.words[slot::ZERO_AT];
        let mut z = w.load(Ordering::Acquire);
        let rate = rate_pm.clamp(1, FULL_RATE);
        loop {
            if z > now && z - now > max_ahead_ns(rate_pm) {
                return 0; // garbage: the next take resets it
            }
            let lead = (z.saturating_sub(now) as u128 * rate as u128 / FULL_RATE as u128) as u64;
            let take = cost.min(lead_max.saturating_sub(lead));
            if take == 0 {
                return 0;
            }
            let floor = now.saturating_sub(window_ns(rate_pm));
            let new = z.max(floor).saturating_add(span_ns(take, rate_pm));
            match w.compare_exchange_weak(z, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return take,
                Err(cur) => z = cur,
            }
        }
    }

    /// Reconcile a charge: `delta` GPU-ns more (positive) or fewer (negative) than was charged.
    pub(crate) fn adjust(&self, delta: i64, rate_pm: u64) {
        if delta == 0 {
            return;
        }
        let span = span_ns(delta.unsigned_abs(), rate_pm);
        let w = &self.words[slot::ZERO_AT];
        if delta > 0 {
            // Saturating: a corrupted word must not wrap round to "full".
            let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |z| {
                Some(z.saturating_add(span))
            });
        } else {
            // Never below 0 (the "never used" marker means full): saturate.
            let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |z| {
                Some(z.saturating_sub(span).max(1))
            });
        }
    }

    /// Tokens (GPU-ns, negative = debt) at `now` and `rate_pm`.
    #[cfg(test)]
    pub(crate) fn tokens(&self, now: u64, rate_pm: u64) -> i64 {
        let z = self.words[slot::ZERO_AT].load(Ordering::Acquire);
        let z = z.max(now.saturating_sub(window_ns(rate_pm)));
        let dt = now as i128 - z as i128;
        (dt * rate_pm.clamp(1, FULL_RATE) as i128 / FULL_RATE as i128) as i64
    }

    /// Clear any debt (limit removed or raised to "unlimited").
    pub(crate) fn forgive(&self, now: u64) {
        let _ = self.words[slot::ZERO_AT].fetch_min(now.max(1), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> [AtomicU64; 8] {
        Default::default()
    }

    const MS: u64 = 1_000_000;
    const T0: u64 = 1_000_000 * MS;

    #[test]
    fn wait_until_agrees_with_charges_and_resets_garbage() {
        let w = words();
        let b = Bucket::new(&w);
        let now = 1_000_000_000;
        assert_eq!(b.wait_until(now, 300), None, "a fresh bucket lets a launch go");
        // Two charges of 8 ms at 30 %: the second leaves the bucket in debt.
        b.charge(now, 8_000_000, 300, false);
        b.charge(now, 8_000_000, 300, false);
        let z = b.wait_until(now, 300).expect("in debt");
        assert_eq!(z, w[slot::ZERO_AT].load(Ordering::Relaxed));
        assert_eq!(b.wait_until(z, 300), None);
        // A word no charge could have left is not waited for.
        w[slot::ZERO_AT].store(u64::MAX - 1, Ordering::Relaxed);
        assert_eq!(b.wait_until(now, 300), None);
        assert_eq!(w[slot::ZERO_AT].load(Ordering::Relaxed), now);
    }

    #[test]
    fn fresh_bucket_is_full_and_grants() {
        let w = words();
        let b = Bucket::new(&w);
        assert_eq!(b.tokens(T0, 300), BURST_GPU_NS as i64);
        assert_eq!(b.try_take(T0, 5 * MS, 300), Take::Granted);
    }

    #[test]
    fn debt_makes_the_next_launch_wait_cost_over_rate() {
        let w = words();
        let b = Bucket::new(&w);
        // Drain the 8 ms burst and go 2 ms into debt with one 10 ms kernel.
        assert_eq!(b.try_take(T0, 10 * MS, 300), Take::Granted);
        // Debt 2 ms GPU at 30 % = 6.67 ms of wall time.
        match b.try_take(T0, 1, 300) {
            Take::WaitUntil(t) => assert!((6_666_000..=6_667_000).contains(&(t - T0)), "{}", t - T0),
            other => panic!("{other:?}"),
        }
        assert_eq!(b.try_take(T0 + 6_667_000, 10 * MS, 300), Take::Granted);
    }

    #[test]
    fn long_run_rate_equals_limit_for_any_kernel_length() {
        for &(kernel, rate) in &[
            (50_000u64, 100u64),
            (50_000, 900),
            (10 * MS, 250),
            (10 * MS, 750),
            (3_000, 500),
        ] {
            let w = words();
            let b = Bucket::new(&w);
            let mut now = T0;
            let mut spent = 0u64;
            let end = T0 + 10_000 * MS;
            while now < end {
                match b.try_take(now, kernel, rate) {
                    Take::Granted => spent += kernel,
                    // Oversleep by 57 µs like a real timer slack: must not lose tokens.
                    Take::WaitUntil(t) => now = t + 57_000,
                }
            }
            let share = spent as f64 / (end - T0) as f64 * 1000.0;
            assert!(
                (share - rate as f64).abs() < 3.0,
                "kernel {kernel} rate {rate}: {share}"
            );
        }
    }

    #[test]
    fn no_one_second_window_exceeds_limit_by_two_points() {
        // Idle for a long time (full bucket), then saturate: the first second is the worst window.
        for &(kernel, rate) in &[(50_000u64, 900u64), (10 * MS, 900), (10 * MS, 100), (MS, 500)] {
            let w = words();
            let b = Bucket::new(&w);
            let _ = b.try_take(T0, 1, rate);
            let start = T0 + 5_000 * MS;
            let mut now = start;
            let mut spent = 0u64;
            while now < start + 1_000 * MS {
                match b.try_take(now, kernel, rate) {
                    Take::Granted => spent += kernel,
                    Take::WaitUntil(t) => now = t,
                }
            }
            let over = spent as f64 / 1e9 * 1000.0 - rate as f64;
            assert!(over <= 20.0, "kernel {kernel} rate {rate}: {over} per-mille over");
        }
    }

    #[test]
    fn adjust_credits_and_debits_at_the_rate() {
        let w = words();
        let b = Bucket::new(&w);
        let _ = b.try_take(T0, 20 * MS, 500); // 8 ms full → −12 ms GPU → wait 24 ms
        b.adjust(-4 * MS as i64, 500); // it was really 16 ms
        assert_eq!(b.try_take(T0, 1, 500), Take::WaitUntil(T0 + 16 * MS));
        b.adjust(2 * MS as i64, 500);
        assert_eq!(b.try_take(T0, 1, 500), Take::WaitUntil(T0 + 20 * MS));
    }

    #[test]
    fn credit_cannot_overfill() {
        let w = words();
        let b = Bucket::new(&w);
        let _ = b.try_take(T0, 1, 500);
        b.adjust(-1_000 * MS as i64, 500);
        assert_eq!(b.tokens(T0, 500), BURST_GPU_NS as i64);
    }

    #[test]
    fn forgiving_charge_never_leaves_debt() {
        let w = words();
        let b = Bucket::new(&w);
        for _ in 0..100 {
            b.charge(T0, 10 * MS, 300, true);
        }
        assert_eq!(b.try_take(T0, 1, 300), Take::Granted);
    }

    #[test]
    fn corrupted_or_stale_word_cannot_block_for_ever() {
        // A dead process scribbled on the word, or the usage file outlived a reboot (its words lie days ahead of
        // the new boot's CLOCK_MONOTONIC): the next take must not be told to wait until then.
        for bad in [u64::MAX, u64::MAX - 1, T0 + 3 * 86_400_000 * MS] {
            for rate in [10u64, 300, 1000] {
                let w = words();
                w[slot::ZERO_AT].store(bad, Ordering::Relaxed);
                let b = Bucket::new(&w);
                match b.try_take(T0, MS, rate) {
                    Take::Granted => {}
                    Take::WaitUntil(t) => {
                        panic!("rate {rate} word {bad}: told to wait {} s", (t - T0) / 1000 / MS)
                    }
                }
                // And the bucket works normally afterwards (1 ms was charged at `rate`).
                let tokens = b.tokens(T0, rate);
                assert!((tokens + MS as i64).abs() <= 1_000, "rate {rate}: {tokens}");
                b.charge(T0, MS, rate, false); // no overflow
                b.adjust(5 * MS as i64, rate);
            }
        }
    }

    #[test]
    fn a_sound_debt_is_kept() {
        // The largest debt the algorithm can make at 1 %: a 10 s charge plus a 10 s correction = 2000 s of wall
        // time. It must still be honoured.
        let w = words();
        let b = Bucket::new(&w);
        assert_eq!(b.try_take(T0, MAX_COST_NS, 10), Take::Granted);
        b.adjust(MAX_COST_NS as i64, 10);
        match b.try_take(T0, 1, 10) {
            Take::WaitUntil(t) => assert!(t - T0 >= 1_990_000 * MS, "{}", t - T0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_debit_never_leaves_the_word_beyond_one_maximal_charge() {
        for rate in [10u64, 300, 1000] {
            let w = words();
            let b = Bucket::new(&w);
            let _ = b.try_take(T0, 1, rate);
            // A 60 s measurement: 10 s go in now, the rest waits for the bucket to drain.
            let owed = 60 * MAX_COST_NS / 10;
            let paid = b.debit(T0, owed, rate);
            assert!(
                (MAX_COST_NS - 2_000_000..=MAX_COST_NS).contains(&paid),
                "rate {rate}: {paid}"
            );
            // The full bucket's burst absorbed the first BURST_GPU_NS: that much more fits, then nothing.
            assert!(b.debit(T0, owed, rate) <= BURST_GPU_NS, "rate {rate}");
            assert_eq!(
                b.debit(T0, owed, rate),
                0,
                "rate {rate}: no room while a full charge is ahead"
            );
            // A launch may still take its tokens once the debt is repaid, and the word is never garbage.
            let z = w[slot::ZERO_AT].load(Ordering::Relaxed);
            assert!(z - T0 <= max_ahead_ns(rate));
            assert_eq!(b.try_take(z, MAX_COST_NS, rate), Take::Granted);
            assert!(b.debit(z, owed, rate) <= 1_000, "rate {rate}: only rounding fits");
            assert!(w[slot::ZERO_AT].load(Ordering::Relaxed) - z <= max_ahead_ns(rate));
        }
    }

    #[test]
    fn concurrent_takers_never_overspend() {
        use std::sync::Arc;
        let w = Arc::new(words());
        let now = T0;
        let granted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (w, granted) = (w.clone(), granted.clone());
                std::thread::spawn(move || {
                    let b = Bucket::new(&w);
                    for _ in 0..1000 {
                        if b.try_take(now, 100_000, 500) == Take::Granted {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // 8 ms of tokens, 0.1 ms each: exactly 80 grants (the 80th reaches zero, then the bucket is at 0 → one
        // more may go into debt).
        let g = granted.load(Ordering::Relaxed);
        assert!((80..=81).contains(&g), "{g}");
    }
}
