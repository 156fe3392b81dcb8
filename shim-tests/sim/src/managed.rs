//! Unified memory as the driver pages it (`CUDASIM_MANAGED=migrate`), the baseline elastic memory is measured
//! against: managed memory is resident in 2 MiB units, none at allocation. A kernel that touches a unit not
//! resident (a `touch` operation, `touch.rs`) migrates it host→device at its launch, charging the device; the
//! kernel takes the migration longer on the timeline (`UNIT` at the host-to-device bandwidth, plus
//! `CUDASIM_MANAGED_FAULT_US`, per unit). An allocation that does not fit evicts resident units of any process
//! (`SharedState::evict_managed`), which each victim marks non-resident, least recently used first, at its next
//! managed-memory operation (`sync`). The bytes stay where they are (the simulator's device memory is host
//! memory): residency is the charge and the time, not where bytes live. Copies and memsets neither migrate nor
//! pay for managed memory.

use std::collections::BTreeMap;

use crate::objects::Objects;
use crate::sim::Sim;
use crate::touch::{Arg, Op};
use crate::types::*;

/// The residency unit.
pub(crate) const UNIT: u64 = 2 << 20;

/// One 2 MiB unit of a managed allocation.
#[derive(Clone, Copy, Debug)]
struct Unit {
    phys: usize,
    resident: bool,
    /// The launch that last touched it (this process's clock).
    last: u64,
}

/// The process's managed units, by address.
#[derive(Default)]
pub(crate) struct Managed {
    units: BTreeMap<u64, Unit>,
    clock: u64,
}

/// Whether the unified memory model is on.
pub(crate) fn on(sim: &Sim) -> bool {
    sim.cfg.managed_fault_ns.is_some()
}

/// Records a managed allocation of `len` bytes (a multiple of `UNIT`) at `p`: nothing resident.
pub(crate) fn on_alloc(o: &mut Objects, p: u64, len: u64, phys: usize) {
    for i in 0..len / UNIT {
        let u = Unit {
            phys,
            resident: false,
            last: 0,
        };
        o.managed.units.insert(p + i * UNIT, u);
    }
}

/// Forgets a managed allocation being freed and returns its resident bytes.
pub(crate) fn on_free(o: &mut Objects, sim: &Sim, p: u64, len: u64, phys: usize) {
    sync(o, sim);
    let mut resident = 0;
    for i in 0..len / UNIT {
        if o.managed
            .units
            .remove(&(p + i * UNIT))
            .is_some_and(|u| u.resident)
        {
            resident += UNIT;
        }
    }
    sim.uncharge_managed(phys, resident);
}

/// Marks as many of this process's least recently used resident units non-resident as others evicted.
pub(crate) fn sync(o: &mut Objects, sim: &Sim) {
    let phys: std::collections::BTreeSet<usize> = o.managed.units.values().map(|u| u.phys).collect();
    for d in phys {
        let mut owed = sim.owed(d);
        while owed > 0 {
            let Some((_, u)) = o
                .managed
                .units
                .iter_mut()
                .filter(|(_, u)| u.phys == d && u.resident)
                .min_by_key(|(&a, u)| (u.last, a))
            else {
                break;
            };
            u.resident = false;
            sim.settle(d, UNIT);
            owed = owed.saturating_sub(UNIT);
        }
    }
}

fn lit(a: Arg) -> u64 {
    match a {
        Arg::Lit(v) => v,
        Arg::Param(_) => 0,
    }
}

/// Makes the managed units a kernel's resolved operations touch resident; the migration's device time (0 when
/// all were resident or the model is off). A unit that cannot be made resident (the device full of memory
/// that cannot be evicted) is CUDA_ERROR_OUT_OF_MEMORY.
pub(crate) fn fault_in(o: &mut Objects, sim: &Sim, ops: &[Op]) -> CuResult<u64> {
    let Some(fault_ns) = sim.cfg.managed_fault_ns else {
        return Ok(0);
    };
    if o.managed.units.is_empty() {
        return Ok(0);
    }
    sync(o, sim);
    let mut ranges = Vec::new();
    for op in ops {
        match *op {
            Op::Read { at, len } | Op::Fill { at, len, .. } | Op::Add { at, len, .. } => {
                ranges.push((lit(at), lit(len)))
            }
            Op::Copy { dst, src, len } => ranges.extend([(lit(dst), lit(len)), (lit(src), lit(len))]),
        }
    }
    o.managed.clock += 1;
    let now = o.managed.clock;
    let mut need = Vec::new();
    for (a, n) in ranges.into_iter().filter(|r| r.1 > 0) {
        let end = a.saturating_add(n);
        for (&s, u) in o.managed.units.range_mut(a.saturating_sub(UNIT - 1)..end) {
            u.last = now;
            need.push(s);
        }
    }
    let mut moved = 0u64;
    for &s in &need {
        let u = o.managed.units[&s];
        if u.resident {
            continue;
        }
        sim.charge_managed(u.phys, UNIT)?;
        o.managed.units.get_mut(&s).expect("listed above").resident = true;
        moved += 1;
        // Charging may have evicted this process's own older units.
        sync(o, sim);
    }
    if need.iter().any(|s| !o.managed.units[s].resident) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mbps = match sim.cfg.engine_mbps[0] {
        0 => sim.cfg.copy_mbps,
        e => e,
    };
    Ok(moved * (UNIT * 1000 / mbps.max(1) + fault_ns))
}

/// Resident bytes of the managed allocation at `p` of `len` bytes (for tests of this module).
#[cfg(test)]
fn resident(m: &Managed, p: u64, len: u64) -> u64 {
    m.units.range(p..p + len).filter(|(_, u)| u.resident).count() as u64 * UNIT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_cover_the_allocation() {
        let mut m = Managed::default();
        for i in 0..3 {
            m.units.insert(
                0x200000 + i * UNIT,
                Unit {
                    phys: 0,
                    resident: i == 1,
                    last: 0,
                },
            );
        }
        assert_eq!(resident(&m, 0x200000, 3 * UNIT), UNIT);
        // A range starting inside a unit finds it.
        let a = 0x200000 + UNIT + 5;
        assert_eq!(m.units.range(a - (UNIT - 1)..a + 1).count(), 1);
    }
}
