//! Taking and releasing a set of locks around `fork` (see `state`'s fork handlers for the order).

use parking_lot::Mutex;

/// Locks every mutex of `locks`, in order, and keeps them locked (the guards are forgotten).
pub fn lock_all<'a, T: 'a>(locks: impl IntoIterator<Item = &'a Mutex<T>>) {
    for l in locks {
        std::mem::forget(l.lock());
    }
}

/// Unlocks every mutex of `locks` that [`lock_all`] locked.
///
/// # Safety
/// Each was locked by `lock_all` on this thread (or in the parent thread this forked child is a copy of), and
/// not unlocked since.
pub unsafe fn unlock_all<'a, T: 'a>(locks: impl IntoIterator<Item = &'a Mutex<T>>) {
    for l in locks {
        // SAFETY: locked by `lock_all`, guard forgotten (the caller's contract).
        unsafe { l.force_unlock() };
    }
}
