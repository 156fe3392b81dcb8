//! Surviving a shared file truncated under its mapping.
//!
//! Every process of a container can write the usage file, so one of them can `ftruncate` it while the others
//! have it mapped: their next access to a page past the new end faults with `SIGBUS`, which kills them by
//! default. A guarded mapping ([`guard`]) is covered by a process-wide `SIGBUS` handler, installed once: a fault
//! inside a guarded range replaces the whole range with private zero pages (`MAP_FIXED` anonymous) and flags
//! it broken, and the faulting access is retried on those pages; any other `SIGBUS` goes to the handler that
//! was installed before ours (or the default action). The owner of the mapping checks [`is_broken`] on its
//! enforcement paths and fails closed: its zero pages are private and carry no one's charges.
//!
//! The handler is async-signal-safe: atomics and `mmap`/`sigaction`/`raise` system calls only, no allocation,
//! no lock. A program that installs its own `SIGBUS` handler *after* ours replaces it (ours then never runs);
//! one installed before ours gets every fault that is not ours.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Guarded ranges at once: the usage file, the HAMi region, the own priority file and every peer's
/// (`priority::MAX_PEERS`), with room to spare; a mapping another container can truncate is never made without
/// one.
pub(crate) const SLOTS: usize = 128;

struct Range {
    start: AtomicUsize,
    /// 0 = slot unused.
    len: AtomicUsize,
    /// `SOUND`, `REPLACING` (a thread is mapping zero pages over it), `ZEROED`, `FAILED` (that mmap failed).
    state: AtomicU8,
}

const SOUND: u8 = 0;
const REPLACING: u8 = 1;
const ZEROED: u8 = 2;
const FAILED: u8 = 3;

static RANGES: [Range; SLOTS] = [const {
    Range {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        state: AtomicU8::new(SOUND),
    }
}; SLOTS];
/// Slots being set up or torn down (claimed by CAS).
static TAKEN: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];

/// The `SIGBUS` disposition in force before ours (set once, before ours is installed).
struct Prev(libc::sigaction);
// SAFETY: plain data (function pointers and a signal mask), written once before any reader can see it.
unsafe impl Send for Prev {}
// SAFETY: as above; only read after publication.
unsafe impl Sync for Prev {}
static PREV: OnceLock<Prev> = OnceLock::new();

/// A guarded range: [`unguard`] it before unmapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Guard(usize);

/// Covers `[ptr, ptr + len)` (a page-aligned mapping of `len` bytes): a `SIGBUS` inside it no longer kills
/// the process. `None` when every slot is taken or the handler could not be installed (the mapping then works
/// as before, unguarded).
pub(crate) fn guard(ptr: *mut u8, len: usize) -> Option<Guard> {
    if !install() {
        return None;
    }
    let i = (0..SLOTS).find(|&i| {
        TAKEN[i]
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    let r = &RANGES[i];
    r.state.store(SOUND, Ordering::Relaxed);
    r.start.store(ptr as usize, Ordering::Relaxed);
    r.len.store(len, Ordering::Release);
    Some(Guard(i))
}

/// Stops covering a range (before it is unmapped).
pub(crate) fn unguard(g: Guard) {
    RANGES[g.0].len.store(0, Ordering::Release);
    TAKEN[g.0].store(false, Ordering::Release);
}

/// Whether the file under the guarded range was found truncated (the range now holds private zero pages).
#[inline]
pub(crate) fn is_broken(g: Guard) -> bool {
    RANGES[g.0].state.load(Ordering::Acquire) != SOUND
}

fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction is plain data; all-zero is a valid value (empty mask, no flags).
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction =
            on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        // SA_ONSTACK: a thread with an alternate stack (one that overflowed) still runs us there. No
        // SA_RESETHAND: we stay installed.
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: as above.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the current disposition into a valid out-pointer.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) } != 0 {
            return false;
        }
        if PREV.set(Prev(prev)).is_err() {
            return false;
        }
        // SAFETY: installing a valid handler; `prev` was published above, before the handler can run.
        unsafe { libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) == 0 }
    })
}

/// Puts the `SIGBUS` disposition that was there before ours back, if ours is still installed: called when the
/// library is unloaded (`dlclose`) or the process exits, so no handler is left pointing into unmapped code.
pub fn uninstall_sigbus_handler() {
    let Some(Prev(prev)) = PREV.get() else { return };
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading the current disposition into a valid out-pointer.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) } != 0 {
        return;
    }
    if cur.sa_sigaction == on_sigbus as Handler as usize {
        // SAFETY: restoring a disposition the kernel handed us.
        unsafe { libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut()) };
    }
}

type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // si_code > 0: raised by the kernel (a fault), so si_addr is the faulting address.
    if code > 0 {
        for r in &RANGES {
            let len = r.len.load(Ordering::Acquire);
            let start = r.start.load(Ordering::Relaxed);
            if len == 0 || addr < start || addr >= start + len {
                continue;
            }
            // The first faulting thread replaces the range; later ones (faulted before that) retry until it
            // is done. If the replacement fails, the fault is not ours to survive: default action.
            match r
                .state
                .compare_exchange(SOUND, REPLACING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: the range is a mapping this process owns (it is unguarded before it is
                    // unmapped); MAP_FIXED replaces it in place with private zero pages, so the retried access
                    // succeeds.
                    let p = unsafe {
                        libc::mmap(
                            start as *mut libc::c_void,
                            len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        )
                    };
                    if p == libc::MAP_FAILED {
                        r.state.store(FAILED, Ordering::Release);
                        break;
                    }
                    r.state.store(ZEROED, Ordering::Release);
                }
                Err(FAILED) => break,
                Err(_) => {}
            }
            return;
        }
    }
    chain(sig, info, ctx, code);
}

/// Hands a `SIGBUS` that is not ours to the disposition that was there before us.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, code: libc::c_int) {
    let Some(Prev(prev)) = PREV.get() else { return };
    let h = prev.sa_sigaction;
    if h == libc::SIG_IGN && code <= 0 {
        return; // a SIGBUS sent by kill(2) to a process that ignores it
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // The default action: restore it and let the fault happen again (or re-raise a sent signal).
        // SAFETY: sigaction and raise are async-signal-safe; a zeroed sigaction with SIG_DFL is valid.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if code <= 0 {
                libc::raise(sig);
            }
        }
        return;
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO has this signature.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_guarded_mapping_reads_zero_and_is_flagged() {
        let path = std::env::temp_dir().join(format!("cuquota-fault-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let len = 3 * 4096;
        f.set_len(len as u64).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we hold, of its size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        let g = guard(p, len).expect("guard");
        // SAFETY: within the mapping.
        unsafe { p.add(2 * 4096).write_volatile(7) };
        f.set_len(0).unwrap();
        // SAFETY: within the (now truncated) mapping: faults, and the handler replaces it with zero pages.
        let v = unsafe { p.add(2 * 4096).read_volatile() };
        assert_eq!(v, 0);
        assert!(is_broken(g));
        unguard(g);
        // SAFETY: the mapping (replaced in place) is still ours.
        unsafe { libc::munmap(p.cast(), len) };
        let _ = std::fs::remove_file(&path);

        // Unloading puts the previous disposition back.
        uninstall_sigbus_handler();
        // SAFETY: sigaction is plain data; reading the current disposition into a valid out-pointer.
        let cur = unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur);
            cur
        };
        assert_eq!(cur.sa_sigaction, PREV.get().unwrap().0.sa_sigaction);
        assert_ne!(cur.sa_sigaction, on_sigbus as Handler as usize);
    }
}
