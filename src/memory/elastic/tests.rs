//! Elastic memory's moves on a fake driver: bytes survive every move, and a move whose create, map or copy
//! fails leaves the range where it was, with nothing leaked.

use super::super::driver::Driver;
use super::super::tests::device_id;
use super::*;
use std::cell::RefCell;
use std::collections::HashMap;

#[derive(Default)]
struct State {
    next_va: u64,
    next_h: u64,
    /// Live handles: their bytes and whether they are host memory.
    handles: HashMap<u64, (Vec<u8>, bool)>,
    /// Mappings: address -> handle.
    maps: HashMap<u64, u64>,
    reserved: HashMap<u64, u64>,
    /// Calls by name, and the (name, nth) calls that fail.
    calls: HashMap<&'static str, u32>,
    fail: Vec<(&'static str, u32)>,
    busy: bool,
    /// Device memory refused with out of memory (host memory still made).
    full: bool,
}

#[derive(Default)]
struct Fake(RefCell<State>);

const REFUSED: CUresult = CUresult::ERROR_UNKNOWN;

impl Fake {
    fn step(&self, name: &'static str) -> Result<(), CUresult> {
        let mut s = self.0.borrow_mut();
        let n = s.calls.entry(name).or_insert(0);
        *n += 1;
        let n = *n;
        if s.fail.contains(&(name, n)) {
            Err(REFUSED)
        } else {
            Ok(())
        }
    }
    fn fail(&self, name: &'static str, nth_from_now: u32) {
        let mut s = self.0.borrow_mut();
        let n = s.calls.get(name).copied().unwrap_or(0) + nth_from_now;
        s.fail.push((name, n));
    }
    fn bytes_at(&self, p: u64) -> Vec<u8> {
        let s = self.0.borrow();
        s.handles[&s.maps[&p]].0.clone()
    }
    fn write(&self, p: u64, v: &[u8]) {
        let mut s = self.0.borrow_mut();
        let h = s.maps[&p];
        s.handles.get_mut(&h).unwrap().0.copy_from_slice(v);
    }
    fn on_host(&self, p: u64) -> bool {
        let s = self.0.borrow();
        s.handles[&s.maps[&p]].1
    }
    /// Handles, mappings and reservations alive.
    fn live(&self) -> (usize, usize, usize) {
        let s = self.0.borrow();
        (s.handles.len(), s.maps.len(), s.reserved.len())
    }
}

impl Driver for Fake {
    fn device_attribute(&self, _: CUdevice_attribute, _: CUdevice) -> Result<i32, CUresult> {
        Err(REFUSED)
    }
    fn function_local_size(&self, _: CUfunction) -> Result<i32, CUresult> {
        Err(REFUSED)
    }
    fn kernel_local_size(&self, _: CUfunction, _: CUdevice) -> Result<i32, CUresult> {
        Err(REFUSED)
    }
    fn stack_size(&self) -> Result<usize, CUresult> {
        Err(REFUSED)
    }
    fn device_count(&self) -> Result<i32, CUresult> {
        Err(REFUSED)
    }
    fn graph_nodes(&self, _: CUgraph) -> Result<Vec<CUgraphNode>, CUresult> {
        Err(REFUSED)
    }
    fn node_type(&self, _: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
        Err(REFUSED)
    }
    fn child_graph(&self, _: CUgraphNode) -> Result<CUgraph, CUresult> {
        Err(REFUSED)
    }
    fn alloc_node(&self, _: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult> {
        Err(REFUSED)
    }
    fn kernel_node(&self, _: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult> {
        Err(REFUSED)
    }
    fn graph_mem_attribute(&self, _: CUdevice, _: CUgraphMem_attribute) -> Result<u64, CUresult> {
        Err(REFUSED)
    }
    fn current_context(&self) -> Result<CUcontext, CUresult> {
        Ok(0x100 as CUcontext)
    }
    fn in_context(&self, _: CUcontext, f: &mut dyn FnMut()) -> Result<(), CUresult> {
        f();
        Ok(())
    }
    fn reserve(&self, size: u64) -> Result<CUdeviceptr, CUresult> {
        self.step("reserve")?;
        let mut s = self.0.borrow_mut();
        s.next_va += 1 << 40;
        let p = s.next_va;
        s.reserved.insert(p, size);
        Ok(p)
    }
    fn address_free(&self, ptr: CUdeviceptr, _: u64) -> Result<(), CUresult> {
        self.step("address_free")?;
        self.0
            .borrow_mut()
            .reserved
            .remove(&ptr)
            .map(|_| ())
            .ok_or(REFUSED)
    }
    fn create(&self, size: u64, on: Option<CUdevice>) -> Result<u64, CUresult> {
        self.step("create")?;
        let mut s = self.0.borrow_mut();
        if s.full && on.is_some() {
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
        s.next_h += 1;
        let h = s.next_h;
        s.handles.insert(h, (vec![0; size as usize], on.is_none()));
        Ok(h)
    }
    fn release(&self, h: u64) -> Result<(), CUresult> {
        self.step("release")?;
        let mut s = self.0.borrow_mut();
        assert!(!s.maps.values().any(|&m| m == h), "a mapped handle released");
        s.handles.remove(&h).map(|_| ()).ok_or(REFUSED)
    }
    fn map(&self, ptr: CUdeviceptr, _: u64, h: u64) -> Result<(), CUresult> {
        self.step("map")?;
        let mut s = self.0.borrow_mut();
        assert!(s.reserved.contains_key(&ptr) && s.handles.contains_key(&h));
        assert!(s.maps.insert(ptr, h).is_none(), "mapped twice");
        Ok(())
    }
    fn unmap(&self, ptr: CUdeviceptr, _: u64) -> Result<(), CUresult> {
        self.step("unmap")?;
        self.0.borrow_mut().maps.remove(&ptr).map(|_| ()).ok_or(REFUSED)
    }
    fn set_access(&self, _: CUdeviceptr, _: u64, _: CUdevice) -> Result<(), CUresult> {
        self.step("set_access")
    }
    fn stream_create(&self) -> Result<CUstream, CUresult> {
        Ok(0x5000 as CUstream)
    }
    fn copy(&self, dst: CUdeviceptr, src: CUdeviceptr, n: u64, _: CUstream) -> Result<(), CUresult> {
        self.step("copy")?;
        let v = self.bytes_at(src);
        assert_eq!(v.len() as u64, n);
        self.write(dst, &v);
        Ok(())
    }
    fn stream_idle(&self, _: CUstream) -> Result<bool, CUresult> {
        Ok(!self.0.borrow().busy)
    }
    fn synchronize(&self) -> Result<(), CUresult> {
        Ok(())
    }
}

const SIZE: u64 = 4096;

fn setup() -> (Fake, Elastic, Dev, impl Drop) {
    let (t, id) = device_id();
    let dev = Dev { ordinal: 0, id };
    let d = Fake::default();
    let e = Elastic::default();
    (d, e, dev, t)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn launch(e: &Elastic, d: &Fake, asked: bool) {
    let no_wait = |_, _, _: &dyn Fn() -> CUresult| panic!("waited with room on the device");
    let r = e.around(d, &[0x7000], |_| asked, no_wait, || CUresult::SUCCESS);
    assert_eq!(r, CUresult::SUCCESS);
}

/// A restore that finds the device full waits for the reclaim, naming the bytes it needs; room during the wait:
/// restored, then the call is made. None after it: the call fails with out of memory unmade, the bytes intact
/// in host memory, the gate left (a move can begin). Control: room at once, no wait (`launch`).
#[test]
fn a_restore_without_room_waits_then_fails_the_call_unmade() {
    let (d, e, dev, _t) = setup();
    let p = e.alloc(&d, dev, SIZE).unwrap();
    d.write(p, &pattern(7));
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    d.0.borrow_mut().full = true;
    let waited = std::cell::Cell::new(None);
    let made = std::cell::Cell::new(false);
    let call = || {
        made.set(true);
        CUresult::SUCCESS
    };
    let no_room = |dev, bytes, retry: &dyn Fn() -> CUresult| {
        waited.set(Some((dev, bytes)));
        retry()
    };
    let r = e.around(&d, &[0x7000], |_| false, no_room, call);
    assert_eq!(r, CUresult::ERROR_OUT_OF_MEMORY);
    assert_eq!(waited.get(), Some((dev, SIZE)), "the bytes it needs, named");
    assert!(!made.get(), "the call is not made");
    assert!(d.on_host(p));
    assert_eq!(d.bytes_at(p), pattern(7));
    assert!(e.gate.begin_move(), "the gate was left");
    e.gate.end_move();
    // Room comes while it waits.
    let room = |_, _, retry: &dyn Fn() -> CUresult| {
        d.0.borrow_mut().full = false;
        retry()
    };
    assert_eq!(e.around(&d, &[0x7000], |_| false, room, call), CUresult::SUCCESS);
    assert!(made.get() && !d.on_host(p));
    assert_eq!(d.bytes_at(p), pattern(7));
    // Control: room at once, no wait.
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
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
    d.0.borrow_mut().busy = true;
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Busy, "a stream still runs");
    assert!(!d.on_host(p));
    d.0.borrow_mut().busy = false;
    // A call in flight.
    assert!(e.gate.enter());
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Busy, "a launch in flight");
    e.gate.leave(&[]);
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Moved(SIZE));
    // Pinned (exported): back now, and never moves again.
    e.pin(&d, p);
    assert!(!d.on_host(p));
    assert_eq!(e.evict(&d, |_, _| Some(SIZE)), Pass::Nothing);
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
