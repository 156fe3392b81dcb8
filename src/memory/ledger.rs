//! The per-process ledger: what this process holds on the GPU, so a free knows what to uncharge.
//!
//! Keys live in separate namespaces (a VMM handle value may equal a device address). Sharded by key hash over
//! `parking_lot` mutexes with pre-sized maps: two threads contend only when their keys hash to the same shard,
//! and a shard lock is held for one map operation, never across a driver call.

use crate::locks::Lock;
use cuquota_core::DeviceId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Keys are driver handles and device addresses, not attacker-chosen strings: a multiply-xorshift mix is
/// enough and costs a few ns where std's SipHash costs tens on every allocation and free.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn write_isize(&mut self, x: isize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

pub(crate) type Map = HashMap<(Space, u64), Record, BuildHasherDefault<KeyHasher>>;

/// What kind of object a key names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Space {
    /// A device address (`cuMemAlloc*`, `cuMemAllocManaged`, stream-ordered allocations).
    Pointer,
    /// A `CUmemGenericAllocationHandle` (`cuMemCreate`).
    Vmm,
    /// A `CUarray`.
    Array,
    /// A `CUmipmappedArray`.
    Mipmapped,
}

/// How a record's bytes are accounted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Charged with its own `bytes`.
    Direct,
    /// A stream-ordered allocation: the pool (by handle, or a destroyed pool's key, `pools::DESTROYED`) carries
    /// the charge; `bytes` is the allocation's rounded size (what its free hands back to the pool's reserve),
    /// charged by no one.
    Pool(usize),
}

/// One live allocation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Record {
    /// Usage-region device entry it is charged to.
    pub entry: DeviceId,
    /// Bytes charged (for `Kind::Pool`: the rounded size, not charged).
    pub bytes: u64,
    /// Accounting kind.
    pub kind: Kind,
}

const SHARDS: usize = 16;

/// Sharded map `(Space, key) → Record`.
pub(crate) struct Ledger {
    shards: [Lock<Map>; SHARDS],
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    /// An empty ledger with room for a few thousand records before any rehash.
    pub(crate) fn new() -> Self {
        Ledger {
            shards: std::array::from_fn(|_| {
                Lock::new(Map::with_capacity_and_hasher(256, Default::default()))
            }),
        }
    }

    fn shard(&self, key: u64) -> &Lock<Map> {
        // Device addresses are aligned (low bits zero): mix before taking the top bits.
        let h = (key ^ (key >> 21)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    /// Records a new allocation, returning any stale record the key had (the driver just handed the key out
    /// again, so whatever it named before is gone: its charge must be released by the caller).
    pub(crate) fn insert(&self, space: Space, key: u64, rec: Record) -> Option<Record> {
        self.shard(key).lock().insert((space, key), rec)
    }

    /// Removes and returns the record for `key`, if this process recorded one.
    pub(crate) fn remove(&self, space: Space, key: u64) -> Option<Record> {
        self.shard(key).lock().remove(&(space, key))
    }

    /// The record for `key`, if any.
    pub(crate) fn get(&self, space: Space, key: u64) -> Option<Record> {
        self.shard(key).lock().get(&(space, key)).copied()
    }

    /// Removes and returns (space, key, record) of every record for which `pred(space, record)` holds (slow
    /// path: scans all shards).
    pub(crate) fn remove_where(&self, pred: impl Fn(Space, &Record) -> bool) -> Vec<(Space, u64, Record)> {
        let mut out = Vec::new();
        for s in &self.shards {
            s.lock().retain(|&(space, key), rec| {
                let drop = pred(space, rec);
                if drop {
                    out.push((space, key, *rec));
                }
                !drop
            });
        }
        out
    }

    /// Re-keys the allocations of pool `from` to pool key `to` (slow path: scans all shards); returns how many.
    pub(crate) fn retag_pool(&self, from: usize, to: usize) -> usize {
        let mut n = 0;
        for s in &self.shards {
            for rec in s.lock().values_mut().filter(|r| r.kind == Kind::Pool(from)) {
                rec.kind = Kind::Pool(to);
                n += 1;
            }
        }
        n
    }

    /// Drops every record (a forked child owns none of its parent's allocations).
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// The shards' locks, in index order (for the fork handlers).
    pub(crate) fn locks(&self) -> &[Lock<Map>] {
        &self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_do_not_collide() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        let r = Record {
            entry: dev,
            bytes: 2 << 20,
            kind: Kind::Direct,
        };
        l.insert(Space::Pointer, 0x7f00_0000_0000, r);
        assert_eq!(l.get(Space::Vmm, 0x7f00_0000_0000), None);
        assert_eq!(l.remove(Space::Pointer, 0x7f00_0000_0000), Some(r));
        assert_eq!(l.remove(Space::Pointer, 0x7f00_0000_0000), None);
    }

    #[test]
    fn retagging_moves_only_that_pools_allocations() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        let rec = |bytes, kind| Record {
            entry: dev,
            bytes,
            kind,
        };
        l.insert(Space::Pointer, 0x1000, rec(2, Kind::Pool(7)));
        l.insert(Space::Pointer, 0x2000, rec(3, Kind::Pool(7)));
        l.insert(Space::Pointer, 0x3000, rec(5, Kind::Pool(8)));
        l.insert(Space::Pointer, 0x4000, rec(11, Kind::Direct));
        assert_eq!(l.retag_pool(7, 9), 2);
        assert_eq!(l.get(Space::Pointer, 0x1000), Some(rec(2, Kind::Pool(9))));
        assert_eq!(l.get(Space::Pointer, 0x3000), Some(rec(5, Kind::Pool(8))));
        assert_eq!(l.get(Space::Pointer, 0x4000), Some(rec(11, Kind::Direct)));
        assert_eq!(l.retag_pool(7, 9), 0);
    }

    #[test]
    fn fork_lock_cycle() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        crate::locks::hold_all(l.locks());
        // SAFETY: locked just above on this thread.
        unsafe { crate::locks::release_all(l.locks(), crate::locks::Side::Parent) };
        l.insert(
            Space::Array,
            1,
            Record {
                entry: dev,
                bytes: 1,
                kind: Kind::Direct,
            },
        );
        l.clear();
        assert_eq!(l.get(Space::Array, 1), None);
    }
}
