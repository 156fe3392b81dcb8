//! Ranges memory's moves on a fake driver: bytes survive every move, and a move whose create, map or copy
//! fails leaves the range where it was, with nothing leaked.

use super::super::driver::fake::{Fake, REFUSED};
use super::super::tests::device_id;
use super::*;

const SIZE: u64 = 4096;

fn setup() -> (Fake, Ranges, Dev, impl Drop) {
    let (t, id) = device_id();
    let dev = Dev { ordinal: 0, id };
    let d = Fake::default();
    let e = Ranges::default();
    (d, e, dev, t)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn launch(e: &Ranges, d: &Fake, asked: bool) {
    let no_wait = |_, _, _: &dyn Fn() -> CUresult| panic!("waited with room on the device");
    let r = e.around(d, &[0x7000], |_| asked, no_wait, || CUresult::SUCCESS);
    assert_eq!(r, CUresult::SUCCESS);
}

/// A restore that finds the device full waits for the reclaim once, naming the bytes it needs; no room within
/// it: the call is made on the host copy (swapped, not out of memory), the bytes intact, and later calls do not
/// wait again but try once per `RETRY_NS`; room then: restored. A new eviction waits again. Control: room at
/// once, no wait (`launch`).
#[test]
fn a_restore_without_room_waits_once_then_the_call_runs_on_the_host_copy() {
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).unwrap();
    d.write(p, &pattern(7));
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    d.set_full(true);
    let waits = std::cell::Cell::new(Vec::new());
    let made = std::cell::Cell::new(0);
    let call = || {
        made.set(made.get() + 1);
        CUresult::SUCCESS
    };
    let wait = |dev, bytes, retry: &dyn Fn() -> CUresult| {
        let mut w = waits.take();
        w.push((dev, bytes));
        waits.set(w);
        retry()
    };
    assert_eq!(e.around(&d, &[0x7000], |_| false, wait, call), CUresult::SUCCESS);
    assert_eq!(waits.take(), vec![(dev, SIZE)], "the bytes it needs, named");
    assert_eq!(made.get(), 1, "the call is made");
    assert!(d.on_host(p));
    assert_eq!(d.bytes_at(p), pattern(7));
    assert!(e.gate.begin_move(), "the gate was left");
    e.gate.end_move();
    // Room now, but within RETRY_NS of the failed wait: the call goes on the host copy, no wait, no try.
    d.set_full(false);
    assert_eq!(e.around(&d, &[0x7000], |_| false, wait, call), CUresult::SUCCESS);
    assert!(waits.take().is_empty() && d.on_host(p) && made.get() == 2);
    // Past RETRY_NS: one try without a wait brings it back.
    e.next_try.store(0, Ordering::Relaxed);
    assert_eq!(e.around(&d, &[0x7000], |_| false, wait, call), CUresult::SUCCESS);
    assert!(waits.take().is_empty() && !d.on_host(p));
    assert_eq!(d.bytes_at(p), pattern(7));
    // A new eviction, the device full again: it waits again.
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    d.set_full(true);
    e.around(&d, &[0x7000], |_| false, wait, call);
    assert_eq!(waits.take().len(), 1, "a new eviction's restore waits again");
    // Control: room at once, no wait.
    d.set_full(false);
    e.next_try.store(0, Ordering::Relaxed);
    launch(&e, &d, false);
    assert!(!d.on_host(p));
}

#[test]
fn bytes_survive_evictions_and_restores_at_the_same_address() {
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).expect("movable");
    assert!(e.on() && e.owns(p));
    for cycle in 0..20u8 {
        let want = pattern(cycle);
        d.write(p, &want);
        assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
        assert!(
            d.on_host(p),
            "cycle {cycle}: evicted to host memory at the same address"
        );
        assert_eq!(e.evicted(dev), SIZE);
        // Still asked: a launch leaves it in host memory (correct there).
        launch(&e, &d, true);
        assert!(d.on_host(p));
        // The agent cleared the bit: the next launch brings it back first.
        launch(&e, &d, false);
        assert!(!d.on_host(p), "cycle {cycle}: restored");
        assert_eq!(d.bytes_at(p), want, "cycle {cycle}: every byte back");
    }
    assert_eq!(e.free(&d, p), Some(CUresult::SUCCESS));
    assert_eq!(
        d.live(),
        (0, 0, 0),
        "nothing left: handles, mappings, reservations"
    );
}

#[test]
fn nothing_moves_without_a_need_or_while_busy() {
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).unwrap();
    // Control: no need, no move.
    assert_eq!(e.evict(&d, |_, _| None), Pass::Nothing);
    assert_eq!(e.evict(&d, |_, _| Some(0)), Pass::Nothing);
    launch(&e, &d, true);
    d.set_busy(true);
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Busy, "a stream still runs");
    assert!(!d.on_host(p));
    d.set_busy(false);
    // A call in flight.
    assert!(e.gate.enter());
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Busy, "a launch in flight");
    e.gate.leave(&[], 0);
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    // Pinned (exported): back now, and never moves again.
    assert!(e.pin(&d, p));
    assert!(!d.on_host(p));
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Nothing);
    // Two exports, one refused: still pinned; both refused: it moves again.
    assert!(e.pin(&d, p));
    e.unpin(p);
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Nothing);
    e.unpin(p);
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    assert!(!e.pin(&d, 0x1234), "not a movable range");
}

/// A context ended: its ranges (resident or in host memory) are freed with it, handles, mappings and
/// reservations all, and its copy stream forgotten. Control: another context's ranges stay.
#[test]
fn an_ended_context_frees_its_ranges() {
    let (d, e, dev, _t) = setup();
    let before = d.live();
    let a = e.alloc(&d, dev, SIZE).unwrap();
    let b = e.alloc(&d, dev, 2 * SIZE).unwrap();
    assert_eq!(e.evict(&d, |_, _| Some(2 * SIZE)), Pass::Moved(2 * SIZE));
    assert!(d.on_host(b) && !d.on_host(a));
    assert_eq!(e.contexts_gone(&d, |c, _| c != 0x100), 0, "another context");
    assert_eq!(e.evicted(dev), 2 * SIZE);
    assert_eq!(e.contexts_gone(&d, |c, _| c == 0x100), 3 * SIZE);
    assert_eq!(d.live(), before, "nothing left");
    assert_eq!(e.evicted(dev), 0);
    assert_eq!(e.on_host.load(Ordering::Relaxed), 0);
    assert!(e.inner.lock().streams.is_empty(), "its copy stream forgotten");
    assert!(!e.owns(a) && !e.owns(b));
}

#[test]
fn only_what_is_above_the_request_moves_largest_first() {
    let (d, e, dev, _t) = setup();
    let small = e.alloc(&d, dev, SIZE).unwrap();
    let big = e.alloc(&d, dev, 2 * SIZE).unwrap();
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(2 * SIZE));
    assert!(d.on_host(big) && !d.on_host(small));
    // The need is computed knowing what is already out: nothing more.
    assert_eq!(
        e.evict(&d, |_, out| Some(SIZE.saturating_sub(out))),
        Pass::Nothing
    );
}

#[test]
fn a_failed_step_loses_nothing_and_leaks_nothing() {
    for (step, nth) in [
        ("create", 1),
        ("reserve", 1),
        ("map", 1),
        ("set_access", 1),
        ("copy", 1),
        ("unmap", 2),
        ("map", 2),
        ("set_access", 2),
    ] {
        for evicting in [true, false] {
            let (d, e, dev, _t) = setup();
            let p = e.alloc(&d, dev, SIZE).unwrap();
            let want = pattern(7);
            d.write(p, &want);
            if !evicting {
                assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
            }
            let live = d.live();
            d.fail(step, nth);
            if evicting {
                assert_eq!(
                    e.evict(&d, |_, _| Some(SIZE)),
                    Pass::Failed(REFUSED),
                    "{step}#{nth}"
                );
                assert!(!d.on_host(p), "{step}#{nth}: still on the device");
                assert_eq!(e.evicted(dev), 0);
            } else {
                launch(&e, &d, false);
                assert!(d.on_host(p), "{step}#{nth}: still in host memory");
                assert_eq!(e.evicted(dev), SIZE);
            }
            assert_eq!(
                d.bytes_at(p),
                want,
                "{step}#{nth} evicting={evicting}: bytes intact"
            );
            assert_eq!(d.live(), live, "{step}#{nth} evicting={evicting}: nothing leaked");
            // The next try works.
            if evicting {
                assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
            } else {
                launch(&e, &d, false);
                assert!(!d.on_host(p));
            }
            assert_eq!(d.bytes_at(p), want);
            assert_eq!(e.free(&d, p), Some(CUresult::SUCCESS));
            assert_eq!(d.live(), (0, 0, 0));
        }
    }
}

#[test]
fn a_failed_make_leaks_nothing_and_a_refused_free_keeps_the_range() {
    for step in ["reserve", "create", "map", "set_access"] {
        let (d, e, dev, _t) = setup();
        d.fail(step, 1);
        assert_eq!(e.alloc(&d, dev, SIZE), Err(REFUSED), "{step}");
        assert_eq!(d.live(), (0, 0, 0), "{step}: nothing leaked");
        assert!(!e.on());
    }
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).unwrap();
    d.fail("unmap", 1);
    assert_eq!(e.free(&d, p), Some(REFUSED));
    assert!(e.owns(p), "a refused free keeps the range");
    assert_eq!(e.free(&d, p), Some(CUresult::SUCCESS));
    assert_eq!(e.free(&d, p), None, "not movable any more");
    assert_eq!(d.live(), (0, 0, 0));
}

/// Peer access: a range is granted to its device and every device that can access it as a peer (VMM memory
/// ignores `cuCtxEnablePeerAccess`), when made, on its host backing and once restored. A driver refusing the
/// peers' grant: the owner's alone, the moves still work. Control: one device, the owner alone.
#[test]
fn a_range_is_granted_to_its_device_and_its_peers_at_every_mapping() {
    for (devices, refuse, want) in [(3, false, vec![1, 0, 2]), (3, true, vec![1]), (0, false, vec![1])] {
        let (d, e, mut dev, _t) = setup();
        dev.ordinal = 1;
        d.set_peers(devices, refuse);
        let p = e.alloc(&d, dev, SIZE).unwrap();
        d.write(p, &pattern(3));
        assert_eq!(d.access_at(p), want, "made ({devices} devices, refused {refuse})");
        assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
        assert!(d.on_host(p));
        assert_eq!(d.access_at(p), want, "on host memory");
        launch(&e, &d, false);
        assert!(!d.on_host(p));
        assert_eq!(d.access_at(p), want, "restored");
        assert_eq!(d.bytes_at(p), pattern(3));
        assert_eq!(e.free(&d, p), Some(CUresult::SUCCESS));
        assert_eq!(d.live(), (0, 0, 0));
    }
}

/// A destroyed context's NULL-stream entry in the gate is forgotten with its ranges (before, it stayed and was
/// asked in whatever context later had its handle). Control: another context's entry stays.
#[test]
fn an_ended_context_s_null_stream_leaves_the_gate() {
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).unwrap();
    e.gate.enter();
    e.gate.leave(&[0], 0x100);
    e.gate.enter();
    e.gate.leave(&[0], 0x900);
    let asked = |e: &Ranges| {
        let seen = std::cell::RefCell::new(Vec::new());
        e.gate.quiescent(|s| {
            seen.borrow_mut().push(gate::legacy_ctx(s));
            Ok(true)
        });
        let mut v = seen.into_inner();
        v.sort();
        v
    };
    assert_eq!(asked(&e), vec![Some(0x100), Some(0x900)]);
    // The peer context (no range of its own, device unknown) destroyed.
    assert_eq!(e.contexts_gone(&d, |c, _| c == 0x900), 0);
    assert_eq!(asked(&e), vec![Some(0x100)], "control: the range's context stays");
    assert!(e.owns(p));
    assert_eq!(e.contexts_gone(&d, |c, on| c == 0x100 && on == Some(dev)), SIZE);
    assert_eq!(asked(&e), Vec::<Option<usize>>::new());
}
