//! Memory requests admitted per GPU: the sum of the requests of the containers on a GPU never exceeds its
//! memory (issue 39). A container is on a GPU when its report lists the GPU (its limits file names it by
//! UUID, or its processes use it); its request there is [`cuquota_core::Policy::request_in_force`] (the limit
//! when no request is set; an uncapped container is promised nothing). Containers admitted by the last pass
//! keep their place; newcomers are admitted in name order while they fit, and one that does not is refused:
//! its device reports `memory_request_refused`, naming the device and the figures. Its limits still apply
//! (nothing acts on a request yet: eviction is later work).

use std::collections::{BTreeMap, BTreeSet};

use cuquota_core::units::format_size;

use crate::report::{ContainerReport, GpuReport};

/// The containers admitted on each GPU (by UUID) at the last pass.
#[derive(Debug, Default)]
pub struct Admission {
    admitted: BTreeMap<String, BTreeSet<String>>,
    /// (GPU, container) refused at the last pass: a refusal is logged once, not every pass.
    refused: BTreeSet<(String, String)>,
}

impl Admission {
    /// Admits this pass's requests on every GPU of `gpus`, marking the refused devices in `containers`;
    /// returns the refusals new since the last pass, (container, why), to be logged.
    pub fn admit(&mut self, gpus: &[GpuReport], containers: &mut [ContainerReport]) -> Vec<(String, String)> {
        let mut now: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut refused = BTreeSet::new();
        let mut new = Vec::new();
        for g in gpus {
            let before = self.admitted.get(&g.uuid);
            // (was admitted before → first, name, container index, device index, request)
            let mut asks: Vec<(bool, String, usize, usize, u64)> = Vec::new();
            for (ci, c) in containers.iter().enumerate() {
                for (di, d) in c.devices.iter().enumerate() {
                    if let (true, Some(r)) = (d.uuid == g.uuid, d.memory_request_bytes) {
                        let kept = before.is_some_and(|b| b.contains(&c.name));
                        asks.push((!kept, c.name.clone(), ci, di, r));
                    }
                }
            }
            asks.sort();
            let mut sum: u64 = 0;
            let admitted = now.entry(g.uuid.clone()).or_default();
            for (_, name, ci, di, r) in asks {
                match sum.checked_add(r).filter(|s| *s <= g.memory_total_bytes) {
                    Some(s) => {
                        sum = s;
                        admitted.insert(name);
                    }
                    None => {
                        let why = format!(
                            "memory request {} on {} (index {}) refused: the requests admitted there sum to {} \
                             of the device's {}, and {} more would exceed it",
                            format_size(r),
                            g.uuid,
                            g.index,
                            format_size(sum),
                            format_size(g.memory_total_bytes),
                            format_size(r),
                        );
                        let key = (g.uuid.clone(), name.clone());
                        if !self.refused.contains(&key) {
                            new.push((name, why.clone()));
                        }
                        refused.insert(key);
                        containers[ci].devices[di].memory_request_refused = Some(why);
                    }
                }
            }
        }
        self.admitted = now;
        self.refused = refused;
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn gpu(total: u64) -> GpuReport {
        GpuReport {
            index: 0,
            uuid: "GPU-a".into(),
            memory_total_bytes: total,
            memory_used_bytes: 0,
            utilization_percent: None,
            processes: 0,
            unattributed_pids: Vec::new(),
        }
    }

    fn container(name: &str, request: Option<u64>) -> ContainerReport {
        ContainerReport::on_one_gpu(name, "GPU-a", request, &[])
    }

    fn refused(cs: &[ContainerReport]) -> Vec<&str> {
        cs.iter()
            .filter(|c| c.devices[0].memory_request_refused.is_some())
            .map(|c| c.name.as_str())
            .collect()
    }

    #[test]
    fn requests_beyond_the_device_are_refused_and_the_admitted_keep_their_place() {
        let g = [gpu(16 * G)];
        let mut a = Admission::default();
        // Control: 6 + 10 fills the device exactly; an uncapped container is promised nothing.
        let mut cs = vec![
            container("b", Some(10 * G)),
            container("c", Some(6 * G)),
            container("u", None),
        ];
        a.admit(&g, &mut cs);
        assert!(refused(&cs).is_empty());
        // Attack: a newcomer whose request does not fit is refused, naming the device and the figures; the
        // admitted ones keep their place although the newcomer sorts first.
        let mut cs = vec![
            container("a", Some(G)),
            container("b", Some(10 * G)),
            container("c", Some(6 * G)),
        ];
        assert_eq!(a.admit(&g, &mut cs).len(), 1, "a new refusal is logged");
        assert_eq!(refused(&cs), ["a"]);
        let mut again = vec![
            container("a", Some(G)),
            container("b", Some(10 * G)),
            container("c", Some(6 * G)),
        ];
        assert!(a.admit(&g, &mut again).is_empty(), "once, not every pass");
        assert_eq!(refused(&again), ["a"]);
        let e = cs[0].devices[0].memory_request_refused.clone().unwrap();
        assert!(
            e.contains("GPU-a") && e.contains("1 GiB") && e.contains("16 GiB") && e.contains("sum to 16 GiB"),
            "{e}"
        );
        // Room again once an admitted container is gone.
        let mut cs = vec![container("a", Some(G)), container("b", Some(10 * G))];
        a.admit(&g, &mut cs);
        assert!(refused(&cs).is_empty());
    }
}
