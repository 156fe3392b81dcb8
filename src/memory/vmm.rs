//! Lifetimes of this process's VMM physical allocations (`cuMemCreate`). The driver frees one only when every
//! handle reference is released (`cuMemCreate`'s, and one per `cuMemRetainAllocationHandle`) and every mapping
//! is unmapped (cuda.h on `cuMemRelease`); its charge (the ledger's `Space::Vmm` record) goes only then. Not on
//! the hot path (`cuMemAlloc` never looks here): one mutex, never held across a driver call.
//!
//! Each change is taken *before* the driver call that makes it (so a handle value the driver hands out again
//! cannot be mistaken for the old one) and undone if the driver refuses.

use crate::locks::Lock;
use std::collections::{BTreeMap, HashMap};

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
    /// Bindings that hold a handle's memory as a mapping does (counted in its `maps`): a sparse array's tile
    /// (`cuMemMapArrayAsync`) or a multicast object's range on one device (`cuMulticastBindMem` / `BindAddr`).
    binds: BTreeMap<BindKey, u64>,
}

/// What a binding is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BindKey {
    /// The array, mipmapped array or multicast object.
    pub obj: u64,
    /// An array tile's device mask; the multicast memory's device.
    pub dev: i64,
    /// An array's subresource type; the offset in the multicast object.
    pub off: u64,
    /// An array's subresource (level, layer, offsets, extents or mip tail); zero for multicast.
    pub rest: [u64; 4],
}

/// What a `cuMemRelease` about to be called does to a handle's charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
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
pub struct Unmapped {
    maps: Vec<(u64, (u64, u64))>,
    binds: Vec<(BindKey, u64)>,
    /// Handles released before whose last mapping this was: their charge goes.
    pub dead: Vec<u64>,
}

/// The lifetimes of the process's VMM handles.
#[derive(Default)]
pub struct VmmLives {
    table: Lock<Table>,
}

impl VmmLives {
    /// `cuMemCreate` returned `h` (a stale entry under that value is gone with its memory).
    pub fn created(&self, h: u64) {
        self.table.lock().handles.insert(h, Life { refs: 1, maps: 0 });
    }

    /// `cuMemRelease(h)` is about to be called.
    pub fn release(&self, h: u64) -> Release {
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
    pub fn undo_release(&self, h: u64, was: Release) {
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
    pub fn retained(&self, h: u64) {
        if let Some(l) = self.table.lock().handles.get_mut(&h) {
            l.refs += 1;
        }
    }

    /// `cuMemMap` mapped `h` at [p, p+size).
    pub fn mapped(&self, p: u64, size: u64, h: u64) {
        let mut t = self.table.lock();
        if let Some(l) = t.handles.get_mut(&h) {
            l.maps += 1;
            t.maps.insert(p, (size, h));
        }
    }

    /// `cuMemUnmap(p, size)` is about to be called: takes the mappings inside the range.
    pub fn unmap(&self, p: u64, size: u64) -> Unmapped {
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
                }
            }
        }
        u
    }

    /// A binding of `h` under `key` was made (the driver said yes); one already under `key` is replaced.
    /// Returns the handles whose memory went with the replaced binding.
    pub fn bound(&self, key: BindKey, h: u64) -> Vec<u64> {
        let mut t = self.table.lock();
        let mut dead = Vec::new();
        if let Some(l) = t.handles.get_mut(&h) {
            l.maps += 1;
            if let Some(old) = t.binds.insert(key, h) {
                Self::drop_bind(&mut t, old, &mut dead);
            }
        }
        dead
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
    pub fn unbind(&self, f: impl Fn(&BindKey) -> bool) -> Unmapped {
        let mut t = self.table.lock();
        let keys: Vec<BindKey> = t.binds.keys().filter(|k| f(k)).copied().collect();
        let mut u = Unmapped::default();
        for k in keys {
            let Some(h) = t.binds.remove(&k) else { continue };
            u.binds.push((k, h));
            Self::drop_bind(&mut t, h, &mut u.dead);
        }
        u
    }

    /// The handle this process mapped at `p`, if one of ours.
    pub fn handle_at(&self, p: u64) -> Option<u64> {
        let t = self.table.lock();
        let (&s, &(size, h)) = t.maps.range(..=p).next_back()?;
        (p < s.saturating_add(size)).then_some(h)
    }

    /// The driver refused the `cuMemUnmap` that [`VmmLives::unmap`] announced.
    pub fn undo_unmap(&self, u: Unmapped) {
        let mut t = self.table.lock();
        for h in &u.dead {
            t.handles.insert(*h, Life { refs: 0, maps: 0 });
        }
        for (k, h) in u.binds {
            if let Some(l) = t.handles.get_mut(&h) {
                l.maps += 1;
            }
            t.binds.insert(k, h);
        }
        for (s, (size, h)) in u.maps {
            if let Some(l) = t.handles.get_mut(&h) {
                l.maps += 1;
            }
            t.maps.insert(s, (size, h));
        }
    }

    /// Forgets everything (a forked child: the parent's handles are not its own).
    pub fn clear(&self) {
        *self.table.lock() = Table::default();
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
            obj,
            dev: 0,
            off: 0,
            rest: [0; 4],
        };
        v.created(7);
        assert!(v.bound(key(1), 7).is_empty());
        assert_eq!(v.release(7), Release::Kept);
        let u = v.unbind(|k| k.obj == 1);
        assert_eq!(u.dead, vec![7]);
        v.undo_unmap(u);
        assert_eq!(v.unbind(|k| k.obj == 2).dead, Vec::<u64>::new());
        // Binding the same key again replaces the old binding.
        v.created(8);
        assert_eq!(v.bound(key(1), 8), vec![7]);
        assert_eq!(v.release(8), Release::Kept);
        assert_eq!(v.unbind(|k| k.obj == 1).dead, vec![8]);
    }

    #[test]
    fn handles_of_others_are_not_followed() {
        let v = VmmLives::default();
        v.mapped(0x1000, 0x100, 9); // an imported handle: not ours
        assert_eq!(v.release(9), Release::Untracked);
        assert!(v.unmap(0x1000, 0x100).dead.is_empty());
    }
}
