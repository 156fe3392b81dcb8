//! The lock of the shim's state: a `parking_lot` mutex that the `fork` handlers can take and release (see
//! `state`'s fork handlers for the order), also in a forked child.
//!
//! Why a wrapper: in the child, *unlocking* a mutex that a parent thread was parked on at the fork would hand it
//! to that thread (parking_lot's wait queues are copied memory; the thread does not exist in the child), and the
//! lock would stay taken for ever. So the child puts a fresh, unlocked mutex in its place instead, which needs
//! the `UnsafeCell` this type owns.

use parking_lot::{Mutex, MutexGuard};
use std::cell::UnsafeCell;

/// Which side of a `fork` releases the locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The parent: unlock, waking its threads that wait.
    Parent,
    /// The child (one thread): replace by an unlocked mutex, waking no one.
    Child,
}

/// A `parking_lot::Mutex<T>` that can be released in a forked child.
pub(crate) struct Lock<T>(UnsafeCell<Mutex<T>>);

// SAFETY: all access goes through the inner mutex, except `release(Side::Child)`, which runs in a forked child's
// only thread while the lock is held by `hold` (no guard exists).
unsafe impl<T: Send> Sync for Lock<T> {}

impl<T> Lock<T> {
    /// An unlocked lock around `value`.
    pub(crate) const fn new(value: T) -> Lock<T> {
        Lock(UnsafeCell::new(Mutex::new(value)))
    }

    fn mutex(&self) -> &Mutex<T> {
        // SAFETY: the mutex is only ever replaced by `release(Side::Child)`, when no reference to it is in use.
        unsafe { &*self.0.get() }
    }

    /// Locks, waiting if needed.
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.mutex().lock()
    }

    /// Locks if free.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.mutex().try_lock()
    }

    /// Locks and keeps it locked (the guard is forgotten): `fork`'s prepare handler.
    pub(crate) fn hold(&self) {
        std::mem::forget(self.lock());
    }

    /// In a forked child: an unlocked lock in place of this one, whoever held it in the parent (a lock that
    /// guards no data, only an order: its holder's thread is gone).
    ///
    /// # Safety
    /// In a forked child's only thread, which holds no guard of this lock.
    pub(crate) unsafe fn reset_in_child(&self) {
        let m = self.0.get();
        // SAFETY: the only thread, no guard or reference in use (the caller's contract).
        unsafe { std::ptr::write(m, Mutex::new(std::ptr::read((*m).data_ptr()))) };
    }

    /// Releases what [`Lock::hold`] took.
    ///
    /// # Safety
    /// Held by `hold` on this thread (or, for [`Side::Child`], in the parent thread this forked child, now
    /// single-threaded, is a copy of), and not released since.
    pub(crate) unsafe fn release(&self, side: Side) {
        match side {
            // SAFETY: locked by `hold`, guard forgotten (the caller's contract).
            Side::Parent => unsafe { self.mutex().force_unlock() },
            Side::Child => {
                let m = self.0.get();
                // SAFETY: the only thread of the child, no guard or reference in use (the caller's contract): the
                // value moves into a fresh mutex and the held one is overwritten without being dropped.
                unsafe { std::ptr::write(m, Mutex::new(std::ptr::read((*m).data_ptr()))) };
            }
        }
    }
}

impl<T> std::fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock").finish_non_exhaustive()
    }
}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Lock::new(T::default())
    }
}

/// [`Lock::hold`] of every lock, in order.
pub(crate) fn hold_all<'a, T: 'a>(locks: impl IntoIterator<Item = &'a Lock<T>>) {
    for l in locks {
        l.hold();
    }
}

/// [`Lock::release`] of every lock.
///
/// # Safety
/// As [`Lock::release`], for each.
pub(crate) unsafe fn release_all<'a, T: 'a>(locks: impl IntoIterator<Item = &'a Lock<T>>, side: Side) {
    for l in locks {
        // SAFETY: the caller's contract.
        unsafe { l.release(side) };
    }
}
