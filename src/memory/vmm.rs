//! Lifetimes of this process's VMM physical allocations (`cuMemCreate`). The driver frees one only when every
//! handle reference is released (`cuMemCreate`'s, and one per `cuMemRetainAllocationHandle`) and every mapping
//! is unmapped (cuda.h on `cuMemRelease`); its charge (the ledger's `Space::Vmm` record) goes only then. Not on
//! the hot path (`cuMemAlloc` never looks here): one mutex, never held across a driver call.
//!
//! Each change is taken *before* the driver call that makes it (so a handle value the driver hands out again
//! cannot be mistaken for the old one) and undone if the driver refuses.

use crate::locks::Lock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

/// References to one physical allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Life {
    refs: u32,
    maps: u32,
}

#[derive(Default)]
pub(crate) struct Table {
    handles: HashMap<u64, Life>,
    /// Mapping start → (size, handle), for handles in `handles` only.
    maps: BTreeMap<u64, (u64, u64)>,
    /// Bindings (key, handle) that hold a handle's memory as a mapping does (counted in its `maps`): a sparse
    /// array's tile (`cuMemMapArrayAsync`) or a multicast object's range on one device (`cuMulticastBindMem` /
    /// `BindAddr`). One key may hold several handles where a failed call leaves it unknown which one the driver
    /// kept (fail closed: all stay charged).
    binds: BTreeSet<(BindKey, u64)>,
    /// Multicast objects of this process (their lives are followed in `handles`) → exported: the last release
    /// of one not exported lets go of its bindings (an exported one may live on in another process).
    multicasts: HashMap<u64, bool>,
}

/// What a binding is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Obj {
    /// An array or mipmapped array.
    Array(u64),
    /// A multicast object.
    Multicast(u64),
}

/// A binding's identity: what an unbind must name exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BindKey {
    /// The object bound to.
    pub obj: Obj,
    /// An array tile's device mask; the multicast memory's device.
    pub dev: i64,
    /// An array's subresource type; the offset in the multicast object.
    pub off: u64,
    /// An array's subresource (level, layer, offsets, extents or mip tail); multicast: `[size, 0, 0, 0]`.
    pub rest: [u64; 4],
}

/// What a `cuMemRelease` about to be called does to a handle's charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Not a handle we follow (never charged here, or already fully released): the ledger decides.
    Untracked,
    /// The last reference of an unmapped allocation: the memory (and its charge) goes.
    Last,
    /// References or mappings remain: the memory lives on, and stays charged.
    Kept,
    /// Every reference was already released (the memory lives while mapped): the driver answers, nothing changes.
    Again,
}

/// Mappings a `cuMemUnmap` about to be called removes, and the handles whose memory goes with them.
#[derive(Debug, Default)]
pub(crate) struct Unmapped {
    maps: Vec<(u64, (u64, u64))>,
    binds: Vec<(BindKey, u64)>,
    /// Handles released before whose last mapping this was: their charge goes.
    pub dead: Vec<u64>,
}

/// The lifetimes of the process's VMM handles.
#[derive(Default)]
pub(crate) struct VmmLives {
    table: Lock<Table>,
    /// `binds.len()`, read without the lock (`cuArrayDestroy` with nothing bound).
    nbinds: AtomicUsize,
}

impl VmmLives {
    /// `cuMemCreate` returned `h` (a stale entry under that value is gone with its memory).
    pub(crate) fn created(&self, h: u64) {
        let mut t = self.table.lock();
        t.handles.insert(h, Life { refs: 1, maps: 0 });
        t.multicasts.remove(&h);
    }

    /// `cuMulticastCreate` returned `h`.
    pub(crate) fn multicast_created(&self, h: u64) {
        let mut t = self.table.lock();
        t.handles.insert(h, Life { refs: 1, maps: 0 });
        t.multicasts.insert(h, false);
    }

    /// `h` was exported (`cuMemExportToShareableHandle`): if a multicast object, another process may keep it and
    /// its bindings alive, which then stay charged here until the process ends (fail closed).
    pub(crate) fn exported(&self, h: u64) {
        if let Some(e) = self.table.lock().multicasts.get_mut(&h) {
            *e = true;
        }
    }

    /// Whether any binding is recorded (one atomic load).
    #[inline]
    pub(crate) fn has_binds(&self) -> bool {
        self.nbinds.load(Ordering::Acquire) != 0
    }

    fn count(&self, t: &Table) {
        self.nbinds.store(t.binds.len(), Ordering::Release);
    }

    /// Multicast object `h` is gone (its last reference and mapping): unless exported, its bindings go too.
    fn multicast_gone(t: &mut Table, h: u64, u: &mut Unmapped) {
        if t.multicasts.remove(&h) != Some(false) {
            return;
        }
        let taken: Vec<(BindKey, u64)> = t
            .binds
            .iter()
            .filter(|(k, _)| k.obj == Obj::Multicast(h))
            .copied()
            .collect();
        for e in taken {
            t.binds.remove(&e);
            u.binds.push(e);
            Self::drop_bind(t, e.1, &mut u.dead);
        }
    }

    /// The last release of multicast object `h` (announced by [`VmmLives::release`] as `Last`) is about to be
    /// called: takes its bindings, as [`VmmLives::unmap`] takes mappings.
    pub(crate) fn released_multicast(&self, h: u64) -> Unmapped {
        let mut t = self.table.lock();
        let mut u = Unmapped::default();
        Self::multicast_gone(&mut t, h, &mut u);
        self.count(&t);
        u
    }

    /// `cuMemRelease(h)` is about to be called.
    pub(crate) fn release(&self, h: u64) -> Release {
        let mut t = self.table.lock();
        let Some(l) = t.handles.get_mut(&h) else {
            return Release::Untracked;
        };
        if l.refs == 0 {
            return Release::Again;
        }
        l.refs -= 1;
        if l.refs == 0 && l.maps == 0 {
            t.handles.remove(&h);
            Release::Last
        } else {
            Release::Kept
        }
    }

    /// The driver refused the `cuMemRelease` that [`VmmLives::release`] announced.
    pub(crate) fn undo_release(&self, h: u64, was: Release) {
        let mut t = self.table.lock();
        match was {
            Release::Untracked | Release::Again => {}
            Release::Last => {
                t.handles.insert(h, Life { refs: 1, maps: 0 });
            }
            Release::Kept => {
                if let Some(l) = t.handles.get_mut(&h) {
                    l.refs += 1;
                }
            }
        }
    }

    /// `cuMemRetainAllocationHandle` returned `h`: one more reference to release.
    pub(crate) fn retained(&self, h: u64) {
        if let Some(l) = self.table.lock().handles.get_mut(&h) {
            l.refs += 1;
        }
    }

    /// `cuMemMap` mapped `h` at [p, p+size).
    pub(crate) fn mapped(&self, p: u64, size: u64, h: u64) {
        let mut t = self.table.lock();
        if let Some(l) = t.handles.get_mut(&h) {
            l.maps += 1;
            t.maps.insert(p, (size, h));
        }
    }

    /// `cuMemUnmap(p, size)` is about to be called: takes the mappings inside the range.
    pub(crate) fn unmap(&self, p: u64, size: u64) -> Unmapped {
        let mut t = self.table.lock();
        let starts: Vec<u64> = t.maps.range(p..p.saturating_add(size)).map(|(&s, _)| s).collect();
        let mut u = Unmapped::default();
        for s in starts {
            let Some(m) = t.maps.remove(&s) else { continue };
            u.maps.push((s, m));
            let h = m.1;
            if let Some(l) = t.handles.get_mut(&h) {
                l.maps -= 1;
                if l.refs == 0 && l.maps == 0 {
                    t.handles.remove(&h);
                    u.dead.push(h);
                    Self::multicast_gone(&mut t, h, &mut u);
                }
            }
        }
        self.count(&t);
        u
    }

    /// A binding of `h` under `key` was made (the driver said yes); those already under `key` are replaced.
    /// Returns the handles whose memory went with the replaced bindings.
    pub(crate) fn bound(&self, key: BindKey, h: u64) -> Vec<u64> {
        let mut t = self.table.lock();
        let mut dead = Vec::new();
        if t.handles.contains_key(&h) {
            let old: Vec<(BindKey, u64)> = t
                .binds
                .range((key, 0)..=(key, u64::MAX))
                .filter(|e| e.1 != h)
                .copied()
                .collect();
            for e in old {
                t.binds.remove(&e);
                Self::drop_bind(&mut t, e.1, &mut dead);
            }
            Self::add_bind(&mut t, key, h);
        }
        self.count(&t);
        dead
    }

    /// A call that would bind `h` under `key` failed, perhaps after taking effect (cuda.h does not say a
    /// failed `cuMemMapArrayAsync` list changed nothing): `h` stays charged as bound, and what was bound under
    /// `key` stays too (fail closed) until an unbind of `key` or the object's end.
    pub(crate) fn maybe_bound(&self, key: BindKey, h: u64) {
        let mut t = self.table.lock();
        if t.handles.contains_key(&h) {
            Self::add_bind(&mut t, key, h);
        }
        self.count(&t);
    }

    fn add_bind(t: &mut Table, key: BindKey, h: u64) {
        if t.binds.insert((key, h)) {
            if let Some(l) = t.handles.get_mut(&h) {
                l.maps += 1;
            }
        }
    }

    fn drop_bind(t: &mut Table, h: u64, dead: &mut Vec<u64>) {
        if let Some(l) = t.handles.get_mut(&h) {
            l.maps -= 1;
            if l.refs == 0 && l.maps == 0 {
                t.handles.remove(&h);
                dead.push(h);
            }
        }
    }

    /// Bindings matching `f` are about to be undone (`cuMemMapArrayAsync`'s unmap, `cuMulticastUnbind`, the
    /// array's destruction): takes them, as [`VmmLives::unmap`] takes mappings.
    pub(crate) fn unbind(&self, f: impl Fn(&BindKey) -> bool) -> Unmapped {
        let mut t = self.table.lock();
        let taken: Vec<(BindKey, u64)> = t.binds.iter().filter(|(k, _)| f(k)).copied().collect();
        let mut u = Unmapped::default();
        for e in taken {
            t.binds.remove(&e);
            u.binds.push(e);
            Self::drop_bind(&mut t, e.1, &mut u.dead);
        }
        self.count(&t);
        u
    }

    /// The handle this process mapped at `p`, if one of ours.
    pub(crate) fn handle_at(&self, p: u64) -> Option<u64> {
        let t = self.table.lock();
        let (&s, &(size, h)) = t.maps.range(..=p).next_back()?;
        (p < s.saturating_add(size)).then_some(h)
    }

    /// The driver refused the `cuMemUnmap` that [`VmmLives::unmap`] announced.
    pub(crate) fn undo_unmap(&self, u: Unmapped) {
        let mut t = self.table.lock();
        for h in &u.dead {
            t.handles.insert(*h, Life { refs: 0, maps: 0 });
        }
        for (k, h) in u.binds {
            Self::add_bind(&mut t, k, h);
        }
        for (s, (size, h)) in u.maps {
            if let Some(l) = t.handles.get_mut(&h) {
                l.maps += 1;
            }
            t.maps.insert(s, (size, h));
        }
        self.count(&t);
    }

    /// Forgets everything (a forked child: the parent's handles are not its own).
    pub(crate) fn clear(&self) {
        *self.table.lock() = Table::default();
        self.nbinds.store(0, Ordering::Release);
    }

    /// The lock, for the fork handlers.
    pub(crate) fn lock(&self) -> &Lock<Table> {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmapped_memory_goes_at_its_release() {
        let v = VmmLives::default();
        v.created(7);
        assert_eq!(v.release(7), Release::Last);
        assert_eq!(v.release(7), Release::Untracked);
    }

    #[test]
    fn mapped_memory_outlives_its_release_until_the_last_unmap() {
        let v = VmmLives::default();
        v.created(7);
        v.mapped(0x1000, 0x100, 7);
        v.mapped(0x2000, 0x100, 7);
        assert_eq!(v.release(7), Release::Kept);
        assert_eq!(v.release(7), Release::Again);
        assert!(v.unmap(0x1000, 0x100).dead.is_empty());
        assert_eq!(v.unmap(0x2000, 0x100).dead, vec![7]);
        assert!(v.unmap(0x2000, 0x100).dead.is_empty());
    }

    #[test]
    fn each_retain_needs_its_own_release() {
        let v = VmmLives::default();
        v.created(7);
        v.mapped(0x1000, 0x100, 7);
        v.retained(7);
        assert_eq!(v.release(7), Release::Kept);
        assert!(v.unmap(0x1000, 0x100).dead.is_empty());
        assert_eq!(v.release(7), Release::Last);
    }

    #[test]
    fn refused_calls_are_undone() {
        let v = VmmLives::default();
        v.created(7);
        v.mapped(0x1000, 0x100, 7);
        let r = v.release(7);
        assert_eq!(r, Release::Kept);
        v.undo_release(7, r);
        let u = v.unmap(0x1000, 0x100);
        assert!(u.dead.is_empty());
        v.undo_unmap(u);
        // Still one reference and one mapping.
        assert_eq!(v.release(7), Release::Kept);
        assert_eq!(v.unmap(0x0, 0x10000).dead, vec![7]);
        // A refused last release restores the reference.
        v.created(8);
        let r = v.release(8);
        v.undo_release(8, r);
        assert_eq!(v.release(8), Release::Last);
    }

    #[test]
    fn a_bound_handle_outlives_its_release_until_unbound() {
        let v = VmmLives::default();
        let key = |obj| BindKey {
            obj: Obj::Array(obj),
            dev: 0,
            off: 0,
            rest: [0; 4],
        };
        assert!(!v.has_binds());
        v.created(7);
        assert!(v.bound(key(1), 7).is_empty());
        assert!(v.has_binds());
        assert_eq!(v.release(7), Release::Kept);
        let u = v.unbind(|k| k.obj == Obj::Array(1));
        assert_eq!(u.dead, vec![7]);
        assert!(!v.has_binds());
        v.undo_unmap(u);
        assert_eq!(v.unbind(|k| k.obj == Obj::Array(2)).dead, Vec::<u64>::new());
        // Binding the same key again replaces the old binding.
        v.created(8);
        assert_eq!(v.bound(key(1), 8), vec![7]);
        assert_eq!(v.release(8), Release::Kept);
        assert_eq!(v.unbind(|k| k.obj == Obj::Array(1)).dead, vec![8]);
    }

    #[test]
    fn a_failed_bind_keeps_both_handles_bound() {
        let v = VmmLives::default();
        let key = BindKey {
            obj: Obj::Array(1),
            dev: 1,
            off: 0,
            rest: [0; 4],
        };
        v.created(7);
        v.created(8);
        assert!(v.bound(key, 7).is_empty());
        v.maybe_bound(key, 8);
        assert_eq!(v.release(7), Release::Kept);
        assert_eq!(v.release(8), Release::Kept);
        let mut dead = v.unbind(|k| *k == key).dead;
        dead.sort();
        assert_eq!(dead, vec![7, 8]);
    }

    #[test]
    fn a_multicast_objects_last_reference_takes_its_bindings() {
        let v = VmmLives::default();
        let key = |mc| BindKey {
            obj: Obj::Multicast(mc),
            dev: 0,
            off: 0,
            rest: [4096, 0, 0, 0],
        };
        v.multicast_created(1);
        v.created(7);
        assert!(v.bound(key(1), 7).is_empty());
        assert_eq!(v.release(7), Release::Kept);
        // Mapped, the object lives past its release; its last unmap takes the binding.
        v.mapped(0x1000, 0x100, 1);
        assert_eq!(v.release(1), Release::Kept);
        let u = v.unmap(0x1000, 0x100);
        assert_eq!(u.dead, vec![1, 7]);
        v.undo_unmap(u);
        // An exported object may live on elsewhere: its bindings stay.
        v.multicast_created(2);
        v.created(8);
        assert!(v.bound(key(2), 8).is_empty());
        assert_eq!(v.release(8), Release::Kept);
        v.exported(2);
        assert_eq!(v.release(2), Release::Last);
        assert!(v.released_multicast(2).dead.is_empty());
        assert!(v.has_binds());
    }

    #[test]
    fn handles_of_others_are_not_followed() {
        let v = VmmLives::default();
        v.mapped(0x1000, 0x100, 9); // an imported handle: not ours
        assert_eq!(v.release(9), Release::Untracked);
        assert!(v.unmap(0x1000, 0x100).dead.is_empty());
    }
}
