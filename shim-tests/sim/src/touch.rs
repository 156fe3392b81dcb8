//! Memory that kernels and copies touch at their time on the device timeline.
//!
//! A `CUDASIM-MODULE` text image may say what a kernel does to memory (`touch <kernel> <op> <operand>…`, see
//! `parse`): the operands are kernel parameters (`pN`, the N-th parameter read as a 64-bit value) or numbers,
//! resolved at launch (the driver copies parameters then). The kernel's operations run at the kernel's end on
//! the timeline, in order, as does every copy and memset queued while such work is pending, so a copy after a
//! kernel sees its writes and an unmap before the kernel's time leaves it nothing to touch. Work that comes due
//! runs at the process's next driver call (or wake-up from a wait) after its time. An operation on memory the
//! kernel may not touch (not an allocation, pinned host memory or a VMM mapping with the access it needs)
//! fails the context with `CUDA_ERROR_ILLEGAL_ADDRESS` (sticky, `context::check_fault`); the context's work
//! still pending is dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::objects::Objects;
use crate::types::*;

/// A kernel parameter (index) or a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    Param(u8),
    Lit(u64),
}

/// Most parameters a touch operand may name.
const MAX_PARAM: u8 = 64;

/// What a kernel does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Loads `len` bytes at `at` (needs read access).
    Read { at: Arg, len: Arg },
    /// Stores byte `value` to `len` bytes at `at`.
    Fill { at: Arg, len: Arg, value: Arg },
    /// Adds `value` (mod 256) to each of `len` bytes at `at` (a load and a store).
    Add { at: Arg, len: Arg, value: Arg },
    /// Copies `len` bytes from `src` to `dst`.
    Copy { dst: Arg, src: Arg, len: Arg },
}

/// Parses the words after `touch <kernel>`: `read A N`, `fill A N V`, `add A N V`, `copy D S N`.
pub(crate) fn parse(words: &[&str]) -> Result<Op, String> {
    let arg = |s: &str| -> Result<Arg, String> {
        match s.strip_prefix('p') {
            Some(i) => match i.parse::<u8>() {
                Ok(i) if i < MAX_PARAM => Ok(Arg::Param(i)),
                _ => Err(format!("bad parameter {s:?} (p0 to p{})", MAX_PARAM - 1)),
            },
            None => s
                .parse::<u64>()
                .map(Arg::Lit)
                .map_err(|_| format!("bad operand {s:?}")),
        }
    };
    Ok(match words {
        ["read", a, n] => Op::Read {
            at: arg(a)?,
            len: arg(n)?,
        },
        ["fill", a, n, v] => Op::Fill {
            at: arg(a)?,
            len: arg(n)?,
            value: arg(v)?,
        },
        ["add", a, n, v] => Op::Add {
            at: arg(a)?,
            len: arg(n)?,
            value: arg(v)?,
        },
        ["copy", d, s, n] => Op::Copy {
            dst: arg(d)?,
            src: arg(s)?,
            len: arg(n)?,
        },
        _ => return Err("expected `touch <kernel> read|fill|add|copy <operands>`".into()),
    })
}

impl Op {
    /// The highest parameter index the operation names, + 1.
    fn params(&self) -> usize {
        let p = |a: &Arg| match a {
            Arg::Param(i) => *i as usize + 1,
            Arg::Lit(_) => 0,
        };
        match self {
            Op::Read { at, len } => p(at).max(p(len)),
            Op::Fill { at, len, value } | Op::Add { at, len, value } => p(at).max(p(len)).max(p(value)),
            Op::Copy { dst, src, len } => p(dst).max(p(src)).max(p(len)),
        }
    }

    /// The operation with its parameters replaced by their values.
    fn resolve(&self, v: &[u64]) -> Op {
        let r = |a: Arg| match a {
            Arg::Param(i) => Arg::Lit(v[i as usize]),
            l => l,
        };
        match *self {
            Op::Read { at, len } => Op::Read {
                at: r(at),
                len: r(len),
            },
            Op::Fill { at, len, value } => Op::Fill {
                at: r(at),
                len: r(len),
                value: r(value),
            },
            Op::Add { at, len, value } => Op::Add {
                at: r(at),
                len: r(len),
                value: r(value),
            },
            Op::Copy { dst, src, len } => Op::Copy {
                dst: r(dst),
                src: r(src),
                len: r(len),
            },
        }
    }
}

/// Resolves a kernel's operations against its `kernelParams` (an array of pointers, one per parameter, each
/// parameter read as 8 bytes). A kernel that touches memory needs `kernelParams`.
///
/// # Safety
/// `params` is the launch's `kernelParams` as the driver receives it (or NULL).
pub(crate) unsafe fn resolve(ops: &[Op], params: *const *const u8) -> CuResult<Vec<Op>> {
    let n = ops.iter().map(Op::params).max().unwrap_or(0);
    if n > 0 && params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's contract: one pointer per parameter, and the kernel declares ≥ n of them.
        let p = unsafe { *params.add(i) };
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as above; parameters need not be aligned.
        v.push(unsafe { std::ptr::read_unaligned(p as *const u64) });
    }
    Ok(ops.iter().map(|o| o.resolve(&v)).collect())
}

/// Work whose effect on memory waits for its time on the timeline.
pub(crate) enum Work {
    /// A kernel's resolved operations.
    Kernel(Vec<Op>),
    /// A copy: which sides are device memory (checked again when it runs), and the source bytes when they
    /// were staged at the call (pageable host memory, as the driver stages it).
    Copy {
        dst: u64,
        src: u64,
        len: u64,
        dst_device: bool,
        src_device: bool,
        staged: Option<Vec<u8>>,
    },
    /// A memset.
    Fill {
        dst: u64,
        value: u32,
        width: u64,
        count: u64,
    },
}

impl Work {
    fn what(&self) -> String {
        match self {
            Work::Kernel(ops) => format!("kernel {ops:x?}"),
            Work::Copy { dst, src, len, .. } => format!("copy of {len} bytes {src:#x} -> {dst:#x}"),
            Work::Fill {
                dst, width, count, ..
            } => format!("memset of {} bytes at {dst:#x}", width * count),
        }
    }
}

/// The process's pending work: (time, sequence) → (context, work).
#[derive(Default)]
pub(crate) struct Pending {
    work: BTreeMap<(u64, u64), (u64, Work)>,
    seq: u64,
}

/// Whether any work is pending (read without the lock by waiters).
static PENDING: AtomicBool = AtomicBool::new(false);

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.work.is_empty()
    }
}

/// Queues `work` of context `ctx` to run at `at`.
pub(crate) fn defer(o: &mut Objects, ctx: u64, at: u64, work: Work) {
    o.pending.seq += 1;
    let seq = o.pending.seq;
    o.pending.work.insert((at, seq), (ctx, work));
    PENDING.store(true, Relaxed);
}

/// Drops the pending work of a context torn down or failed.
pub(crate) fn forget_context(o: &mut Objects, ctx: u64) {
    o.pending.work.retain(|_, (c, _)| *c != ctx);
    PENDING.store(!o.pending.work.is_empty(), Relaxed);
}

/// Whether a kernel on device `dev` may touch [p, p+len): device memory, pinned host memory, or a VMM mapping
/// with read (`write`: read-write) access for `dev` (peer access enabled does not grant VMM memory's).
fn kernel_may(o: &Objects, dev: Option<usize>, p: u64, len: u64, write: bool) -> bool {
    let Some(end) = p.checked_add(len) else {
        return false;
    };
    if len == 0 {
        return true;
    }
    if let Some((s, a)) = o.mem.find(p) {
        if end <= s + a.len {
            return true;
        }
    }
    if let Some((s, l)) = o.mem.find_host(p) {
        if end <= s + l {
            return true;
        }
    }
    o.vmm.kernel_access(p, len, write, dev)
}

fn lit(a: Arg) -> u64 {
    match a {
        Arg::Lit(v) => v,
        Arg::Param(_) => 0,
    }
}

/// Runs one piece of work of context `ctx`; `Err` = it touched memory it may not.
fn run(o: &Objects, ctx: u64, work: &Work) -> CuResult<()> {
    match work {
        Work::Kernel(ops) => {
            let dev = crate::context::device_of(o, ctx).ok().map(|(ordinal, _)| ordinal);
            let kernel_may = |p, len, write| kernel_may(o, dev, p, len, write);
            for op in ops {
                match *op {
                    Op::Read { at, len } => {
                        if !kernel_may(lit(at), lit(len), false) {
                            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                    }
                    Op::Fill { at, len, value } => {
                        if !kernel_may(lit(at), lit(len), true) {
                            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        crate::memory::fill(lit(at), lit(value) as u32 & 0xff, 1, lit(len));
                    }
                    Op::Add { at, len, value } => {
                        let (p, n) = (lit(at), lit(len));
                        if !kernel_may(p, n, true) {
                            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        // SAFETY: [p, p+n) was checked above to be memory this process maps read-write.
                        let b = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n as usize) };
                        for x in b {
                            *x = x.wrapping_add(lit(value) as u8);
                        }
                    }
                    Op::Copy { dst, src, len } => {
                        let n = lit(len);
                        if !kernel_may(lit(src), n, false) || !kernel_may(lit(dst), n, true) {
                            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        crate::memory::copy(lit(dst), lit(src), n);
                    }
                }
            }
        }
        Work::Copy {
            dst,
            src,
            len,
            dst_device,
            src_device,
            staged,
        } => {
            let bad = |dev: bool, p: u64| dev && crate::memory::check_device_range(o, p, *len).is_err();
            if bad(*dst_device, *dst) || bad(*src_device, *src) {
                return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
            }
            match staged {
                // SAFETY: dst checked above (device) or the program's host memory, as with any copy.
                Some(b) => unsafe { std::ptr::copy(b.as_ptr(), *dst as *mut u8, b.len()) },
                None => crate::memory::copy(*dst, *src, *len),
            }
        }
        Work::Fill {
            dst,
            value,
            width,
            count,
        } => {
            if crate::memory::check_device_range(o, *dst, width * count).is_err() {
                return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
            }
            crate::memory::fill(*dst, *value, *width, *count);
        }
    }
    Ok(())
}

/// Runs the pending work whose time has come, in time order. A piece that fails marks its context (sticky)
/// and drops that context's other pending work. Called under the objects lock (`objects::with`).
pub(crate) fn drain(o: &mut Objects) {
    if o.pending.work.is_empty() {
        return;
    }
    let now = crate::timeline::now_ns();
    while let Some(entry) = o.pending.work.first_entry() {
        if entry.key().0 > now {
            break;
        }
        let ((at, _), (ctx, work)) = entry.remove_entry();
        if let Err(e) = run(o, ctx, &work) {
            crate::abi::log(|| format!("{} due at {at} touched memory it may not: {e}", work.what()));
            if let Some(c) = o.contexts.get_mut(&ctx) {
                c.fault = e;
            }
            o.pending.work.retain(|_, (c, _)| *c != ctx);
        }
    }
    PENDING.store(!o.pending.work.is_empty(), Relaxed);
}

/// Waits for all the process's pending work and runs it (cuMemFree and cuMemFreeHost synchronise, as the
/// driver's do, so memory is never freed under a queued kernel or copy). Call without the objects lock.
pub(crate) fn wait_all() {
    if !PENDING.load(Relaxed) {
        return;
    }
    let last = crate::objects::with(|o| o.pending.work.last_key_value().map(|(k, _)| k.0));
    if let Some(t) = last {
        crate::timeline::sleep_until(t);
    }
    after_wait();
}

/// After a wait: runs the work that came due meanwhile (takes the objects lock; call without it).
pub(crate) fn after_wait() {
    if PENDING.load(Relaxed) {
        crate::objects::with(|_| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_operations() {
        assert_eq!(
            parse(&["add", "p0", "p1", "3"]),
            Ok(Op::Add {
                at: Arg::Param(0),
                len: Arg::Param(1),
                value: Arg::Lit(3)
            })
        );
        assert_eq!(parse(&["copy", "p1", "p0", "4096"]).map(|o| o.params()), Ok(2));
        assert!(parse(&["read", "p0"]).is_err());
        assert!(parse(&["write", "p0", "1"]).is_err());
        assert!(parse(&["read", "p64", "1"]).is_err());
        assert!(parse(&["read", "q0", "1"]).is_err());
    }

    #[test]
    fn resolves_parameters() {
        let (a, n) = (0x1000u64, 64u64);
        let ps = [&a as *const u64 as *const u8, &n as *const u64 as *const u8];
        let ops = [Op::Fill {
            at: Arg::Param(0),
            len: Arg::Param(1),
            value: Arg::Lit(7),
        }];
        // SAFETY: two parameters, each 8 bytes.
        let r = unsafe { resolve(&ops, ps.as_ptr()) }.unwrap();
        assert_eq!(
            r,
            vec![Op::Fill {
                at: Arg::Lit(a),
                len: Arg::Lit(n),
                value: Arg::Lit(7)
            }]
        );
        // SAFETY: NULL kernelParams is refused before any read.
        let none = unsafe { resolve(&ops, std::ptr::null()) };
        assert_eq!(none, Err(CUDA_ERROR_INVALID_VALUE));
    }
}
