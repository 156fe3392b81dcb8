//! Whether the process is quiescent, and the door launches and copies go through while a range may move.
//!
//! A launch or copy `enter`s (one increment, one load) before the driver call and `leave`s after it, noting
//! its stream. The mover sets `moving` and then reads `inflight` (both sequentially consistent): either it sees
//! the call in flight and tries later, or the call sees `moving` and waits for the mover's lock. Once nothing is
//! in flight, every stream the process launched or copied on is asked `cuStreamQuery`: all idle = quiescent.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Streams remembered; a process with more (or one using the per-thread default stream, which another thread
/// cannot query) is never found quiescent.
const STREAMS: usize = 64;

/// Marks the legacy default stream (NULL, `CU_STREAM_LEGACY`) in the table.
const LEGACY: usize = crate::ffi::cuda::CU_STREAM_LEGACY;
const PER_THREAD: usize = crate::ffi::cuda::CU_STREAM_PER_THREAD;

pub(super) struct Gate {
    inflight: AtomicU64,
    moving: AtomicBool,
    streams: [AtomicUsize; STREAMS],
    /// A stream nobody else can query was used (the per-thread default stream, or one past the table).
    unprovable: AtomicBool,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            inflight: AtomicU64::new(0),
            moving: AtomicBool::new(false),
            streams: std::array::from_fn(|_| AtomicUsize::new(0)),
            unprovable: AtomicBool::new(false),
        }
    }
}

impl Gate {
    /// A call enters: false = a move is in progress (the caller backs out with [`Gate::back_out`] and waits for
    /// the mover's lock).
    #[inline]
    pub(super) fn enter(&self) -> bool {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        !self.moving.load(Ordering::SeqCst)
    }

    /// Undoes an [`Gate::enter`] that found a move in progress.
    pub(super) fn back_out(&self) {
        self.inflight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Enters while the caller holds the mover's lock (no move can be in progress then).
    pub(super) fn enter_locked(&self) {
        self.inflight.fetch_add(1, Ordering::SeqCst);
    }

    /// The call returned: its streams are remembered, then it is no longer in flight. `ctx`: the context the
    /// call was made in (0: not known), needed only when a stream is the legacy NULL stream, which is each
    /// context's own: a kernel on device B's NULL stream touching device A's range (peer access) is asked in B.
    #[inline]
    pub(super) fn leave(&self, streams: &[usize], ctx: usize) {
        for &s in streams {
            self.note(s, ctx);
        }
        self.inflight.fetch_sub(1, Ordering::SeqCst);
    }

    fn note(&self, stream: usize, ctx: usize) {
        let s = if stream == 0 || stream == LEGACY {
            legacy_of(ctx)
        } else {
            stream
        };
        if s == PER_THREAD {
            self.unprovable.store(true, Ordering::Relaxed);
            return;
        }
        if self.streams.iter().any(|w| w.load(Ordering::Relaxed) == s) {
            return;
        }
        for w in &self.streams {
            if w.compare_exchange(0, s, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
        self.unprovable.store(true, Ordering::Relaxed);
    }

    /// The mover (holding its lock) starts a move: false = a call is in flight (try later).
    pub(super) fn begin_move(&self) -> bool {
        self.moving.store(true, Ordering::SeqCst);
        if self.inflight.load(Ordering::SeqCst) != 0 {
            self.moving.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The move is over (before the mover's lock is let go).
    pub(super) fn end_move(&self) {
        self.moving.store(false, Ordering::SeqCst);
    }

    /// Whether every stream used is idle, asked through `idle` (`Ok(true)` idle, `Ok(false)` busy, `Err` of a
    /// stream that no longer exists: forgotten; any other error counts as busy, as a capturing stream's does).
    /// Call between [`Gate::begin_move`] and [`Gate::end_move`].
    pub(super) fn quiescent(&self, idle: impl Fn(usize) -> Result<bool, Gone>) -> bool {
        if self.unprovable.load(Ordering::Relaxed) {
            return false;
        }
        for w in &self.streams {
            let s = w.load(Ordering::Relaxed);
            if s == 0 {
                continue;
            }
            match idle(s) {
                Ok(true) => {}
                Ok(false) => return false,
                Err(Gone) => {
                    let _ = w.compare_exchange(s, 0, Ordering::Relaxed, Ordering::Relaxed);
                }
            }
        }
        true
    }

    /// Forgets the NULL-stream entries of the contexts `gone` names (ended: a destroyed context's handle may
    /// be a new context's later, and pushing a destroyed one is not the driver's to answer safely).
    pub(super) fn forget_null_streams(&self, gone: impl Fn(usize) -> bool) {
        for w in &self.streams {
            let s = w.load(Ordering::Relaxed);
            if legacy_ctx(s).is_some_and(&gone) {
                let _ = w.compare_exchange(s, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// After fork, in the child.
    pub(super) fn reset(&self) {
        self.inflight.store(0, Ordering::Relaxed);
        self.moving.store(false, Ordering::Relaxed);
        for w in &self.streams {
            w.store(0, Ordering::Relaxed);
        }
        self.unprovable.store(false, Ordering::Relaxed);
    }
}

/// A stream that no longer exists.
pub(super) struct Gone;

/// Whether a call's streams include the legacy NULL stream (then its context is to be noted).
#[inline]
pub(super) fn has_legacy(streams: &[usize]) -> bool {
    streams.iter().any(|&s| s == 0 || s == LEGACY)
}

/// The table's word for context `ctx`'s legacy NULL stream: the context handle (aligned) tagged in its low bit;
/// [`LEGACY`] itself when the context is not known.
fn legacy_of(ctx: usize) -> usize {
    if ctx == 0 || ctx & 1 != 0 {
        LEGACY
    } else {
        ctx | 1
    }
}

/// The context whose legacy NULL stream a table word `s` names (`None`: an ordinary stream, or [`LEGACY`]:
/// the NULL stream of whatever context is current).
pub(super) fn legacy_ctx(s: usize) -> Option<usize> {
    (s & 1 != 0 && s != LEGACY).then_some(s & !1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_in_flight_stops_a_move_and_a_move_stops_a_call() {
        let g = Gate::default();
        assert!(g.enter());
        assert!(!g.begin_move(), "a call in flight: no move");
        g.leave(&[7], 0);
        assert!(g.begin_move());
        assert!(!g.enter(), "a move in progress: the call waits");
        g.back_out();
        g.end_move();
        assert!(g.enter());
        g.leave(&[], 0);
    }

    #[test]
    fn busy_streams_and_unqueryable_ones_are_not_quiescent() {
        let g = Gate::default();
        g.enter();
        g.leave(&[0, 0x1000], 0);
        assert!(g.quiescent(|_| Ok(true)));
        assert!(!g.quiescent(|s| Ok(s != 0x1000)), "one busy stream");
        // A destroyed stream is forgotten, not waited for.
        assert!(g.quiescent(|s| if s == 0x1000 { Err(Gone) } else { Ok(true) }));
        assert!(g.quiescent(|s| Ok(s != 0x1000)), "forgotten");
        g.enter();
        g.leave(&[PER_THREAD], 0);
        assert!(
            !g.quiescent(|_| Ok(true)),
            "the per-thread stream cannot be asked"
        );
    }

    /// The NULL stream is each context's own: used in two contexts, it is two entries, each asked in its
    /// context (before, one `LEGACY` entry was asked in the mover's context only, and a kernel on another
    /// device's NULL stream went unseen).
    #[test]
    fn the_null_stream_is_noted_per_context() {
        let g = Gate::default();
        g.enter();
        g.leave(&[0], 0x5000);
        g.enter();
        g.leave(&[LEGACY], 0x9000);
        let busy_in_9000 = |s: usize| Ok(legacy_ctx(s) != Some(0x9000));
        assert!(
            !g.quiescent(busy_in_9000),
            "the second context's NULL stream is busy"
        );
        let seen = std::cell::RefCell::new(Vec::new());
        assert!(g.quiescent(|s| {
            seen.borrow_mut().push(legacy_ctx(s));
            Ok(true)
        }));
        let mut seen = seen.into_inner();
        seen.sort();
        assert_eq!(seen, vec![Some(0x5000), Some(0x9000)]);
        assert!(has_legacy(&[0x1000, 0]) && !has_legacy(&[0x1000]));
    }

    /// A context ended: its NULL-stream entry goes (not asked again), another context's and ordinary streams
    /// stay (the control).
    #[test]
    fn an_ended_context_s_null_stream_is_forgotten() {
        let g = Gate::default();
        g.enter();
        g.leave(&[0, 0x1000], 0x5000);
        g.enter();
        g.leave(&[0], 0x9000);
        g.forget_null_streams(|c| c == 0x9000);
        let seen = std::cell::RefCell::new(Vec::new());
        assert!(g.quiescent(|s| {
            seen.borrow_mut().push(s);
            Ok(true)
        }));
        let mut seen = seen.into_inner();
        seen.sort();
        assert_eq!(seen, vec![0x1000, 0x5001]);
    }

    #[test]
    fn more_streams_than_the_table_are_not_quiescent() {
        let g = Gate::default();
        g.enter();
        let many: Vec<usize> = (1..=STREAMS + 1).map(|i| 0x1000 * i).collect();
        g.leave(&many, 0);
        assert!(!g.quiescent(|_| Ok(true)));
    }
}
