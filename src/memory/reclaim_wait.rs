//! The bounded wait for the agent's reclaim (issue 39, elastic memory): an allocation admitted within the limit,
//! or a restore of evicted memory, that the driver refused for want of device memory says so in the usage
//! file's `waiting` word and tries again while the agent asks idle elastic tenants to move memory to the host.

use super::elastic::Elastic;
use crate::devices::Dev;
use crate::ffi::cuda::CUresult;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Longest sleep between two tries.
const STEP_MAX: Duration = Duration::from_millis(50);

impl Elastic {
    /// `call` refused `bytes` on `dev` for want of device memory: under an agent limits file whose agent
    /// reclaims (`LIMITS_FLAG_RECLAIM`), the `waiting` word names them and `call` is tried again with backoff
    /// for up to `CUQUOTA_RECLAIM_WAIT_MS`; returns its last answer (out of memory at once otherwise).
    #[cold]
    #[inline(never)]
    pub(crate) fn reclaim_wait(&self, dev: Dev, bytes: u64, call: &dyn Fn() -> CUresult) -> CUresult {
        let wait_ms = self.devices.config().reclaim_wait_ms;
        if wait_ms == 0 || !self.devices.reclaims() {
            return CUresult::ERROR_OUT_OF_MEMORY;
        }
        let start = Instant::now();
        let bound = Duration::from_millis(wait_ms.into());
        let word = ((dev.id.index() as u64 + 1) << 56) | bytes.min((1 << 56) - 1);
        let waiting = self.usage().waiting();
        // One word per container: another waiter already there speaks for this one too.
        let mine = waiting
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        let mut step = Duration::from_millis(1);
        let r = loop {
            std::thread::sleep(step.min(bound.saturating_sub(start.elapsed())));
            let r = call();
            if r != CUresult::ERROR_OUT_OF_MEMORY || start.elapsed() >= bound {
                break r;
            }
            step = (step * 2).min(STEP_MAX);
        };
        if mine {
            let _ = waiting.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        r
    }
}
