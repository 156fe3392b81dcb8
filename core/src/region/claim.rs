//! Device entries claimed once by UUID, shared by the usage file and the node's priority file: the owner word
//! goes free → claiming (claimer pid) → live, so every process ends with the same entry for a UUID.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::layout::*;
use super::liveness::{current_pid, is_alive};
use super::RegionError;

/// How long a claim waits for another process's claim in progress.
const DEVICE_CLAIM_WAIT: Duration = Duration::from_secs(2);

/// The owner word's next generation (every transition bumps it, so a CAS never confuses two states).
pub(super) fn next_gen(word: u64) -> u32 {
    owner_generation(word).wrapping_add(1)
}

/// A device entry of a region file: its owner word and UUID words.
pub(super) trait DeviceEntry {
    fn owner(&self) -> &AtomicU64;
    fn uuid(&self) -> &[AtomicU64; 2];
}

impl DeviceEntry for UsageDevice {
    fn owner(&self) -> &AtomicU64 {
        &self.owner
    }
    fn uuid(&self) -> &[AtomicU64; 2] {
        &self.uuid
    }
}

impl DeviceEntry for PriorityDevice {
    fn owner(&self) -> &AtomicU64 {
        &self.owner
    }
    fn uuid(&self) -> &[AtomicU64; 2] {
        &self.uuid
    }
}

/// The index of the live entry for `uuid` in `devices` (of the file at `path`), claiming a free one if no entry
/// has it yet. Slow path (once per process and device); may wait up to ~2 s for another process's claim in
/// progress, and takes over the claim of a process that died claiming.
pub(super) fn claim_device<E: DeviceEntry>(
    devices: &[E],
    uuid: &[u8; 16],
    path: &Path,
) -> Result<usize, RegionError> {
    let words = uuid_to_words(uuid);
    let me = current_pid();
    let deadline = Instant::now() + DEVICE_CLAIM_WAIT;
    loop {
        let mut first_free = None;
        let mut claiming = None;
        for (i, d) in devices.iter().enumerate() {
            let w = d.owner().load(Ordering::Acquire);
            match owner_state(w) {
                STATE_LIVE => {
                    if d.uuid()[0].load(Ordering::Relaxed) == words[0]
                        && d.uuid()[1].load(Ordering::Relaxed) == words[1]
                    {
                        return Ok(i);
                    }
                }
                STATE_FREE => {
                    first_free.get_or_insert((i, w));
                }
                _ => {
                    claiming.get_or_insert((i, w));
                }
            }
        }
        let (i, w) = match (claiming, first_free) {
            // An unfinished claim might be for our UUID: resolve it before claiming a new entry.
            (Some((i, w)), _) => {
                if is_alive(owner_pid(w), None) {
                    if Instant::now() >= deadline {
                        return Err(RegionError::DeviceClaimBusy {
                            path: path.to_path_buf(),
                            pid: owner_pid(w),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                (i, w) // its claimer died: take it over
            }
            (None, Some(free)) => free,
            (None, None) => {
                return Err(RegionError::DevicesExhausted {
                    path: path.to_path_buf(),
                    max: devices.len(),
                })
            }
        };
        let d = &devices[i];
        let mine = owner_word(me, STATE_CLAIMING, next_gen(w));
        if d.owner()
            .compare_exchange(w, mine, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        d.uuid()[0].store(words[0], Ordering::Relaxed);
        d.uuid()[1].store(words[1], Ordering::Relaxed);
        let ready = owner_word(me, STATE_LIVE, next_gen(mine));
        if d.owner()
            .compare_exchange(mine, ready, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(i);
        }
    }
}
