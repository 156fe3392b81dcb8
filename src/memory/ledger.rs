//! The per-process ledger: what this process holds on the GPU, so a free knows what to uncharge.
//!
//! Keys live in separate namespaces (a VMM handle value may equal a device address). Device addresses, what every
//! cuMemAlloc and cuMemFree records and looks up, live in a fixed lock-free table of 8-way buckets (a way's control
//! byte is its own spin lock for the few instructions a record takes to read or write); the other namespaces, and
//! addresses whose bucket is full, in maps sharded by key hash over `parking_lot` mutexes, each lock held
//! for one map operation, never across a driver call.

use crate::locks::Lock;
use cuquota_core::DeviceId;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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

/// Buckets of the device-address table (a power of two), 8 ways each: a few thousand live allocations fit
/// before a bucket is full and a record goes to the sharded maps.
const BUCKETS: usize = 1024;
const WAYS: usize = 8;
/// Control bytes (one per way, eight in a bucket's control word): a way never used or freed, a way a thread
/// claimed for the few instructions it takes to read or write its key and record, and an occupied way
/// (`OCCUPIED | 7 bits of the key's hash`).
const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const OCCUPIED: u8 = 0x80;
const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// One bucket: its control word says which ways hold which hash tags, so a lookup reads one word and
/// compares a full key only where the tag matches (one in 128 ways by chance).
struct Bucket {
    ctrl: AtomicU64,
    keys: [UnsafeCell<u64>; WAYS],
    recs: [UnsafeCell<Option<Record>>; WAYS],
}

/// `(Space, key) → Record`: device addresses (every cuMemAlloc and cuMemFree) in a lock-free table of 8-way
/// buckets, where a way's control byte is also its lock (`CLAIMED` while a thread reads or writes it), so an
/// allocation and a free cost a compare-and-swap or two and no mutex; everything else, and addresses whose
/// bucket is full, in maps sharded over mutexes.
pub(crate) struct Ledger {
    table: Box<[Bucket; BUCKETS]>,
    /// Device-address records that live in the maps (their bucket was full): a free looks there only then.
    overflow: AtomicUsize,
    shards: [Lock<Map>; SHARDS],
}

// SAFETY: a way's key and record are only touched by the thread that set its control byte to `CLAIMED` with a
// compare-and-swap (acquire), until it sets the byte again (release): the byte is a spin lock around them.
unsafe impl Sync for Ledger {}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

/// The control byte of way `w` in `word`.
#[inline]
fn byte(word: u64, w: usize) -> u8 {
    (word >> (8 * w)) as u8
}

/// The high bit of each byte of `word` that may equal `v` (exact for the lowest; one above a match may be a
/// false positive: callers check the byte).
#[inline]
fn maybe_equal(word: u64, v: u8) -> u64 {
    let y = word ^ (LO * v as u64);
    y.wrapping_sub(LO) & !y & HI
}

/// Waits a little for a claimed way to be let go (a few instructions, unless its thread was preempted).
#[cold]
fn back_off(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl Bucket {
    /// Claims way `w` if its control byte is still `seen`.
    #[inline]
    fn claim(&self, w: usize, seen: u8) -> bool {
        let mut cur = self.ctrl.load(Ordering::Relaxed);
        loop {
            if byte(cur, w) != seen {
                return false;
            }
            let new = cur ^ (((seen ^ CLAIMED) as u64) << (8 * w));
            match self
                .ctrl
                .compare_exchange_weak(cur, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Lets go of claimed way `w` with control byte `to`.
    #[inline]
    fn let_go(&self, w: usize, to: u8) {
        self.ctrl
            .fetch_xor(((CLAIMED ^ to) as u64) << (8 * w), Ordering::Release);
    }

    /// The key of claimed way `w`.
    #[inline]
    fn key(&self, w: usize) -> u64 {
        // SAFETY: claimed by this thread (`claim` succeeded), so no other thread touches it.
        unsafe { *self.keys[w].get() }
    }

    /// The record of claimed way `w`.
    #[inline]
    fn rec(&self, w: usize) -> Option<Record> {
        // SAFETY: claimed by this thread (`claim` succeeded), so no other thread touches it.
        unsafe { *self.recs[w].get() }
    }

    /// Writes key and record of claimed way `w`.
    #[inline]
    fn write(&self, w: usize, key: u64, rec: Option<Record>) {
        // SAFETY: claimed by this thread (`claim` succeeded), so no other thread touches them.
        unsafe {
            *self.keys[w].get() = key;
            *self.recs[w].get() = rec;
        }
    }

    /// The way holding `key` (whose tag is `tag`), claimed; `None` when no way holds it. A way another thread
    /// holds claimed may be `key`'s: waited for.
    #[inline]
    fn find(&self, key: u64, tag: u8) -> Option<usize> {
        let mut spins = 0;
        'again: loop {
            let cur = self.ctrl.load(Ordering::Acquire);
            let mut m = maybe_equal(cur, tag);
            while m != 0 {
                let w = m.trailing_zeros() as usize / 8;
                m &= m - 1;
                if byte(cur, w) != tag {
                    continue;
                }
                if !self.claim(w, tag) {
                    continue 'again;
                }
                if self.key(w) == key {
                    return Some(w);
                }
                self.let_go(w, tag);
            }
            if maybe_equal(cur, CLAIMED) != 0 {
                back_off(&mut spins);
                continue 'again;
            }
            return None;
        }
    }
}

impl Ledger {
    /// An empty ledger.
    pub(crate) fn new() -> Self {
        Ledger {
            table: (0..BUCKETS)
                .map(|_| Bucket {
                    ctrl: AtomicU64::new(0),
                    keys: std::array::from_fn(|_| UnsafeCell::new(0)),
                    recs: std::array::from_fn(|_| UnsafeCell::new(None)),
                })
                .collect::<Box<[Bucket]>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!("BUCKETS buckets")),
            overflow: AtomicUsize::new(0),
            shards: std::array::from_fn(|_| Lock::new(Map::with_capacity_and_hasher(64, Default::default()))),
        }
    }

    fn shard(&self, key: u64) -> &Lock<Map> {
        // Device addresses are aligned (low bits zero): mix before taking the top bits.
        let h = (key ^ (key >> 21)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    /// `key`'s bucket and control tag.
    #[inline]
    fn slot(&self, key: u64) -> (&Bucket, u8) {
        let h = (key ^ (key >> 21)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (
            &self.table[(h >> 40) as usize % BUCKETS],
            OCCUPIED | (h >> 57) as u8,
        )
    }

    /// Records a new allocation, returning any stale record the key had (the driver just handed the key out
    /// again, so whatever it named before is gone: its charge must be released by the caller).
    #[inline]
    pub(crate) fn insert(&self, space: Space, key: u64, rec: Record) -> Option<Record> {
        if space == Space::Pointer {
            let (b, tag) = self.slot(key);
            // The common case: no way holds the tag or is claimed, nothing overflowed and a way is free: the
            // key is new, so the lowest free way is claimed from the word just read (a changed word falls
            // through).
            let cur = b.ctrl.load(Ordering::Acquire);
            let free = maybe_equal(cur, FREE);
            if free != 0
                && maybe_equal(cur, tag) | maybe_equal(cur, CLAIMED) == 0
                && self.overflow.load(Ordering::Relaxed) == 0
            {
                let w = free.trailing_zeros() as usize / 8;
                let new = cur ^ ((CLAIMED as u64) << (8 * w));
                if b.ctrl
                    .compare_exchange(cur, new, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    b.write(w, key, Some(rec));
                    b.let_go(w, tag);
                    return None;
                }
            }
        }
        self.insert_slow(space, key, rec)
    }

    /// [`Ledger::insert`] beyond the common case (out of line, so that case inlines into its callers).
    #[inline(never)]
    fn insert_slow(&self, space: Space, key: u64, rec: Record) -> Option<Record> {
        if space != Space::Pointer {
            return self.shard(key).lock().insert((space, key), rec);
        }
        let (b, tag) = self.slot(key);
        if let Some(w) = b.find(key, tag) {
            let stale = b.rec(w);
            b.write(w, key, Some(rec));
            b.let_go(w, tag);
            return stale;
        }
        let stale = self.take_overflow(key, |_| {});
        loop {
            // The lowest flagged byte is exactly a free way.
            let m = maybe_equal(b.ctrl.load(Ordering::Relaxed), FREE);
            if m == 0 {
                break;
            }
            let w = m.trailing_zeros() as usize / 8;
            if b.claim(w, FREE) {
                b.write(w, key, Some(rec));
                b.let_go(w, tag);
                return stale;
            }
        }
        self.overflow.fetch_add(1, Ordering::Relaxed);
        self.shard(key).lock().insert((space, key), rec).or(stale)
    }

    /// A device-address record the maps hold for `key` (taken out; `seen` called before the shard lets go).
    #[inline]
    fn take_overflow(&self, key: u64, seen: impl FnOnce(&Record)) -> Option<Record> {
        if self.overflow.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut shard = self.shard(key).lock();
        let rec = shard.remove(&(Space::Pointer, key));
        if let Some(r) = &rec {
            seen(r);
            self.overflow.fetch_sub(1, Ordering::Relaxed);
        }
        rec
    }

    /// Removes and returns the record for `key`, if this process recorded one.
    pub(crate) fn remove(&self, space: Space, key: u64) -> Option<Record> {
        self.remove_seen(space, key, |_| {})
    }

    /// [`Ledger::remove`], calling `seen` with the record before it leaves: a scan (`retag_pool`,
    /// `remove_where`) either saw the record or runs after `seen` returned. `seen` must not use the ledger.
    #[inline]
    pub(crate) fn remove_seen(&self, space: Space, key: u64, seen: impl FnOnce(&Record)) -> Option<Record> {
        if space != Space::Pointer {
            let mut shard = self.shard(key).lock();
            let rec = shard.remove(&(space, key));
            if let Some(r) = &rec {
                seen(r);
            }
            return rec;
        }
        let (b, tag) = self.slot(key);
        if let Some(w) = b.find(key, tag) {
            let rec = b.rec(w);
            if let Some(r) = &rec {
                seen(r);
            }
            b.let_go(w, FREE);
            return rec;
        }
        self.take_overflow(key, seen)
    }

    /// The record for `key`, if any.
    pub(crate) fn get(&self, space: Space, key: u64) -> Option<Record> {
        if space == Space::Pointer {
            let (b, tag) = self.slot(key);
            if let Some(w) = b.find(key, tag) {
                let rec = b.rec(w);
                b.let_go(w, tag);
                return rec;
            }
            if self.overflow.load(Ordering::Relaxed) == 0 {
                return None;
            }
        }
        self.shard(key).lock().get(&(space, key)).copied()
    }

    /// Visits every table record in a claimed way: `f` returns it as kept (`Some`) or removed (`None`).
    fn scan_table(&self, mut f: impl FnMut(u64, Record) -> Option<Record>) {
        for b in self.table.iter() {
            for w in 0..WAYS {
                let mut spins = 0;
                loop {
                    let seen = byte(b.ctrl.load(Ordering::Acquire), w);
                    if seen == FREE {
                        break;
                    }
                    if seen == CLAIMED || !b.claim(w, seen) {
                        back_off(&mut spins);
                        continue;
                    }
                    let key = b.key(w);
                    match b.rec(w).and_then(|r| f(key, r)) {
                        Some(r) => {
                            b.write(w, key, Some(r));
                            b.let_go(w, seen);
                        }
                        None => {
                            b.write(w, 0, None);
                            b.let_go(w, FREE);
                        }
                    }
                    break;
                }
            }
        }
    }

    /// Removes and returns (space, key, record) of every record for which `pred(space, key, record)` holds
    /// (slow path: scans the table and all shards; a record is held while `pred` looks at it).
    pub(crate) fn remove_where(
        &self,
        pred: impl Fn(Space, u64, &Record) -> bool,
    ) -> Vec<(Space, u64, Record)> {
        let mut out = Vec::new();
        self.scan_table(|key, rec| {
            if pred(Space::Pointer, key, &rec) {
                out.push((Space::Pointer, key, rec));
                None
            } else {
                Some(rec)
            }
        });
        for s in &self.shards {
            s.lock().retain(|&(space, key), rec| {
                let drop = pred(space, key, rec);
                if drop {
                    if space == Space::Pointer {
                        self.overflow.fetch_sub(1, Ordering::Relaxed);
                    }
                    out.push((space, key, *rec));
                }
                !drop
            });
        }
        out
    }

    /// Re-keys the allocations of pool `from` to pool key `to` (slow path: scans the table and all shards);
    /// returns how many.
    pub(crate) fn retag_pool(&self, from: usize, to: usize) -> usize {
        let mut n = 0;
        self.scan_table(|_, mut rec| {
            if rec.kind == Kind::Pool(from) {
                rec.kind = Kind::Pool(to);
                n += 1;
            }
            Some(rec)
        });
        for s in &self.shards {
            for rec in s.lock().values_mut().filter(|r| r.kind == Kind::Pool(from)) {
                rec.kind = Kind::Pool(to);
                n += 1;
            }
        }
        n
    }

    /// Drops every record (a forked child owns none of its parent's allocations). Only where no other thread
    /// uses the ledger: a way a parent thread held claimed at the fork is taken over.
    pub(crate) fn clear(&self) {
        for b in self.table.iter() {
            b.ctrl.store(u64::from_ne_bytes([CLAIMED; 8]), Ordering::Relaxed);
            for w in 0..WAYS {
                b.write(w, 0, None);
            }
            b.ctrl.store(0, Ordering::Release);
        }
        self.overflow.store(0, Ordering::Relaxed);
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// The shards' locks, in index order (for the fork handlers; the table needs none).
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
    fn more_addresses_than_the_table_holds_all_come_back() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        let rec = |bytes| Record {
            entry: dev,
            bytes,
            kind: Kind::Pool(bytes as usize % 3),
        };
        let n = (BUCKETS * WAYS) as u64 * 2;
        for i in 1..=n {
            assert_eq!(l.insert(Space::Pointer, i << 21, rec(i)), None);
        }
        assert!(l.overflow.load(Ordering::Relaxed) > 0, "some went to the maps");
        // A key handed out again returns its stale record, wherever it lives.
        assert_eq!(l.insert(Space::Pointer, 5 << 21, rec(5)), Some(rec(5)));
        assert_eq!(l.insert(Space::Pointer, n << 21, rec(n)), Some(rec(n)));
        assert_eq!(l.retag_pool(1, 7), (1..=n).filter(|i| i % 3 == 1).count());
        let removed = l.remove_where(|_, _, r| r.kind == Kind::Pool(2));
        assert_eq!(removed.len(), (1..=n).filter(|i| i % 3 == 2).count());
        for i in (1..=n).filter(|i| i % 3 != 2) {
            let want = Record {
                kind: Kind::Pool(if i % 3 == 1 { 7 } else { 0 }),
                ..rec(i)
            };
            assert_eq!(l.get(Space::Pointer, i << 21), Some(want), "key {i}");
            assert_eq!(l.remove(Space::Pointer, i << 21), Some(want), "key {i}");
            assert_eq!(l.remove(Space::Pointer, i << 21), None, "key {i}");
        }
        assert_eq!(l.overflow.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn threads_never_lose_or_share_a_record() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let l = &l;
                sc.spawn(move || {
                    for round in 0..2000u64 {
                        // Every thread's keys collide on the same few slots, and reuse addresses.
                        let key = ((round % 8) * 4 + t + 1) << 20;
                        let r = Record {
                            entry: dev,
                            bytes: round,
                            kind: Kind::Direct,
                        };
                        assert_eq!(l.insert(Space::Pointer, key, r), None);
                        assert_eq!(l.remove(Space::Pointer, key), Some(r));
                    }
                });
            }
        });
        assert_eq!(l.remove_where(|_, _, _| true), vec![]);
    }

    #[test]
    fn any_address_is_a_key() {
        let (_region, dev) = crate::memory::tests::device_id();
        let l = Ledger::new();
        let r = Record {
            entry: dev,
            bytes: 1,
            kind: Kind::Direct,
        };
        for key in [0, u64::MAX] {
            assert_eq!(l.insert(Space::Pointer, key, r), None);
            assert_eq!(l.get(Space::Pointer, key), Some(r));
            assert_eq!(l.remove(Space::Pointer, key), Some(r));
        }
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
