//! What the priority tests (tests/priority.rs, tests/priority_attacks.rs) share: one test at a time, the
//! bursts' shape (c/priority_tenant.c's arguments) and percentiles.

/// One test at a time: they time the device, and CI has 2 cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seconds of bursts per run.
pub const SECS: f64 = 3.0;
/// Kernels per high-priority burst.
pub const BURST: u32 = 20;
/// Each burst kernel, ns.
pub const KERNEL_NS: u64 = 200_000;
/// Idle gap between bursts (random in this range), ns.
pub const GAP_NS: (u64, u64) = (10_000_000, 40_000_000);
/// The best-effort tenant's kernels (random in this range), ns.
pub const BE_NS: (u64, u64) = (1_000_000, 5_000_000);

/// The `p`th percentile of `v` (nearest rank).
pub fn pct(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s[((s.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// Nanoseconds as milliseconds, for messages.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
