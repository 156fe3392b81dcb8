//! Kernel launches: validation, capture into a graph, or scheduling on the device timeline. Every launch path
//! (cuLaunchKernel, Ex, cooperative, multi-device, legacy cuLaunch*, graphs) ends here.

use crate::graph::KernelLaunch;
use crate::objects::with;
use crate::sim::Sim;
use crate::stream;
use crate::timeline::{kernel_duration, sleep_until};
use crate::types::*;

/// Most blocks of a cooperative kernel per SM (all must be co-resident).
const COOP_BLOCKS_PER_SM: u64 = 32;

/// Checks grid and block dimensions against the device limits.
pub(crate) fn validate_dims(grid: [u32; 3], block: [u32; 3]) -> CuResult<()> {
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if grid[1] > 65535 || grid[2] > 65535 || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if block.iter().map(|&b| b as u64).product::<u64>() > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Launches kernels on stream handle `stream` (each a function or kernel handle with its grid): captured
/// when the stream is capturing, else queued on the device timeline. Blocks (sleeping, without the lock)
/// while the stream's queue is full.
pub(crate) fn launch(sim: &Sim, stream_h: u64, kernels: &[KernelLaunch], cooperative: bool) -> CuResult<()> {
    for k in kernels {
        validate_dims(k.grid, k.block)?;
    }
    // Managed memory migrated for each kernel (`managed.rs`), once: a launch that waits for room retries.
    let mut migration: Option<Vec<u64>> = None;
    loop {
        let wait = with(|o| -> CuResult<Option<u64>> {
            let s = stream::resolve(o, sim, stream_h)?;
            let ctx = o.streams[&s].ctx;
            let (_, phys) = crate::context::device_of(o, ctx)?;
            let sms = sim.cfg.devices[phys].sms as u64;
            let mut durations = Vec::with_capacity(kernels.len());
            let mut local = 0;
            let mut touch = Vec::new();
            let first = migration.is_none();
            let mut migrated = Vec::with_capacity(kernels.len());
            for (i, k) in kernels.iter().enumerate() {
                let (func, mut ns) = crate::module::function_for(o, sim, k.func, ctx)?;
                if let Some(i) = o.functions.get(&func).and_then(|f| f.length) {
                    if k.params != crate::graph::NO_PARAMS && k.params != 0 {
                        // SAFETY: `params` is the caller's kernelParams for this launch: one pointer per
                        // parameter, the kernel declaring at least `i + 1` (the image says so).
                        let p = unsafe { *(k.params as *const *const u8).add(i) };
                        if !p.is_null() {
                            // SAFETY: as above; parameters need not be aligned.
                            let v = unsafe { std::ptr::read_unaligned(p as *const u64) };
                            if v != 0 {
                                ns = v;
                            }
                        }
                    }
                }
                local = o.functions.get(&func).map_or(0, |f| f.local).max(local);
                let ops = o.functions.get(&func).map_or(&[][..], |f| &f.touch[..]);
                if !ops.is_empty() && o.streams[&s].capture.is_none() {
                    if k.params == crate::graph::NO_PARAMS {
                        return Err(CUDA_ERROR_NOT_SUPPORTED);
                    }
                    // SAFETY: `params` is the caller's kernelParams for this launch (or NULL).
                    let ops = unsafe { crate::touch::resolve(ops, k.params as *const *const u8)? };
                    if first {
                        migrated.push(crate::managed::fault_in(o, sim, &ops)?);
                    }
                    touch.extend(ops);
                } else if first {
                    migrated.push(0);
                }
                let blocks: u64 = k.grid.iter().map(|&g| g as u64).product();
                if cooperative && blocks > sms * COOP_BLOCKS_PER_SM {
                    return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
                }
                let extra =
                    migration.as_ref().map_or(0, |m: &Vec<u64>| m[i]) + migrated.get(i).copied().unwrap_or(0);
                durations.push(kernel_duration(k.grid, sms, ns) + extra);
            }
            if first && o.streams[&s].capture.is_none() {
                migration = Some(migrated);
            }
            if o.streams[&s].capture.is_some() {
                for k in kernels {
                    // The parameters are the caller's only during this call.
                    let k = KernelLaunch {
                        params: crate::graph::NO_PARAMS,
                        ..*k
                    };
                    crate::graph::capture_kernel(o, s, k)?;
                }
                return Ok(None);
            }
            crate::context::grow_stack(o, sim, ctx, local)?;
            let wait = stream::enqueue(o, sim, s, phys, &durations)?;
            if wait.is_none() && !touch.is_empty() {
                // At the kernels' end (now, behind a wait for a value: a simplification).
                let st = &o.streams[&s];
                let at = if st.held.is_empty() {
                    st.tail
                } else {
                    crate::timeline::now_ns()
                };
                crate::touch::defer(o, ctx, at, crate::touch::Work::Kernel(touch));
            }
            Ok(wait)
        })?;
        match wait {
            None => return Ok(()),
            Some(t) => sleep_until(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims() {
        assert!(validate_dims([1, 1, 1], [1, 1, 1]).is_ok());
        assert!(validate_dims([u32::MAX, 65535, 65535], [1024, 1, 1]).is_ok());
        assert!(validate_dims([0, 1, 1], [1, 1, 1]).is_err());
        assert!(validate_dims([1, 65536, 1], [1, 1, 1]).is_err());
        assert!(validate_dims([1, 1, 1], [1025, 1, 1]).is_err());
        assert!(validate_dims([1, 1, 1], [32, 32, 2]).is_err());
        assert!(validate_dims([1, 1, 1], [1, 1, 65]).is_err());
    }
}
