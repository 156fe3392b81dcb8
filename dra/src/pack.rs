//! Scheduling on paper: how many GPUs a stream of fractional claims needs when the scheduler packs them by
//! the slices' consumable capacities, against one whole GPU per claim (docs/kubernetes.md, "Packing").
//!
//! The model is the DRA allocator's: a claim's request is rounded up to the capacity's `requestPolicy` step
//! (memory 256 MiB, SM 1 %), and it goes to the first device (nodes in order, each node's devices in slice
//! order) whose remaining `memory` and `sm` both hold it. The real scheduler picks among feasible nodes by
//! its scores, which do not look at DRA capacity, so first fit over nodes is an approximation: a
//! least-allocated spread would use more GPUs at the same load.

use crate::slice::MEMORY_STEP;

/// One claim's request: bytes of memory, percent of SM time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Memory, bytes.
    pub memory: u64,
    /// SM share, percent (1-100).
    pub sm: u32,
}

/// A kind of workload: uniform ranges of memory (bytes) and SM share (percent).
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Its name.
    pub name: &'static str,
    /// Memory range.
    pub memory: (u64, u64),
    /// SM share range.
    pub sm: (u32, u32),
}

/// The three workloads.
pub const NOTEBOOK: Workload = Workload {
    name: "notebook",
    memory: (1 << 30, 4 << 30),
    sm: (10, 30),
};
/// Inference servers.
pub const INFERENCE: Workload = Workload {
    name: "inference",
    memory: (4 << 30, 16 << 30),
    sm: (20, 50),
};
/// Training jobs.
pub const TRAINING: Workload = Workload {
    name: "training",
    memory: (24 << 30, 80 << 30),
    sm: (50, 100),
};

/// A deterministic generator (splitmix64): the same seed gives the same stream.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

impl Workload {
    /// One request, memory in whole steps.
    pub fn draw(&self, rng: &mut Rng) -> Request {
        let steps = rng.range(self.memory.0 / MEMORY_STEP, self.memory.1 / MEMORY_STEP);
        Request {
            memory: steps * MEMORY_STEP,
            sm: rng.range(self.sm.0 as u64, self.sm.1 as u64) as u32,
        }
    }
}

/// A stream of `n` claims drawn from a mix (workload, weight).
pub fn stream(mix: &[(Workload, u32)], n: usize, seed: u64) -> Vec<Request> {
    let mut rng = Rng::new(seed);
    let total: u64 = mix.iter().map(|(_, w)| *w as u64).sum();
    (0..n)
        .map(|_| {
            let mut pick = rng.range(0, total - 1);
            let w = mix
                .iter()
                .find(|(_, w)| {
                    if pick < *w as u64 {
                        true
                    } else {
                        pick -= *w as u64;
                        false
                    }
                })
                .map_or(mix[0].0, |(w, _)| *w);
            w.draw(&mut rng)
        })
        .collect()
}

/// The result of packing a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Packing {
    /// Claims placed (all of them: nodes are added as needed).
    pub claims: usize,
    /// GPUs holding at least one claim.
    pub gpus: usize,
    /// Nodes with at least one claim.
    pub nodes: usize,
    /// Mean share of the used GPUs' memory granted, percent.
    pub memory_pct: f64,
    /// Mean SM share granted on the used GPUs, percent.
    pub sm_pct: f64,
}

/// Packs `claims` first fit onto nodes of `gpus_per_node` GPUs of `gpu_memory` bytes each (as many nodes as
/// needed). A request larger than a GPU panics (the scheduler would leave it pending).
pub fn first_fit(claims: &[Request], gpus_per_node: usize, gpu_memory: u64) -> Packing {
    // (memory left, sm left) per GPU, node after node.
    let mut free: Vec<(u64, u32)> = Vec::new();
    for c in claims {
        assert!(c.memory <= gpu_memory && c.sm <= 100, "{c:?} fits no GPU");
        match free.iter_mut().find(|(m, s)| *m >= c.memory && *s >= c.sm) {
            Some(g) => {
                g.0 -= c.memory;
                g.1 -= c.sm;
            }
            None => {
                // A new node: its first GPU takes the claim.
                let first = free.len();
                free.extend(std::iter::repeat_n((gpu_memory, 100), gpus_per_node));
                free[first].0 -= c.memory;
                free[first].1 -= c.sm;
            }
        }
    }
    let used: Vec<&(u64, u32)> = free.iter().filter(|(m, s)| *m < gpu_memory || *s < 100).collect();
    let nodes = free
        .chunks(gpus_per_node)
        .filter(|n| n.iter().any(|(m, s)| *m < gpu_memory || *s < 100))
        .count();
    let n = used.len().max(1) as f64;
    Packing {
        claims: claims.len(),
        gpus: used.len(),
        nodes,
        memory_pct: used
            .iter()
            .map(|(m, _)| (gpu_memory - m) as f64 * 100.0 / gpu_memory as f64)
            .sum::<f64>()
            / n,
        sm_pct: used.iter().map(|(_, s)| (100 - s) as f64).sum::<f64>() / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn first_fit_fills_a_gpu_by_both_capacities_before_the_next() {
        let r = |m: u64, sm: u32| Request { memory: m * G, sm };
        // Two 40 GiB claims share a GPU; a third opens the next GPU. SM binds too: 60 + 50 > 100.
        let p = first_fit(&[r(40, 10), r(40, 10), r(1, 10)], 8, 80 * G);
        assert_eq!((p.gpus, p.nodes), (2, 1));
        let p = first_fit(&[r(1, 60), r(1, 50), r(1, 40)], 8, 80 * G);
        assert_eq!(p.gpus, 2, "60 + 40 share a GPU, 50 goes to the next");
        assert_eq!(p.sm_pct, 75.0);
        // A new node once every GPU of the first is full.
        let p = first_fit(&[r(80, 100); 9], 8, 80 * G);
        assert_eq!((p.gpus, p.nodes), (9, 2));
    }

    #[test]
    fn streams_are_seeded_and_within_their_ranges() {
        let mix = [(NOTEBOOK, 1), (TRAINING, 1)];
        let a = stream(&mix, 500, 7);
        assert_eq!(a, stream(&mix, 500, 7));
        assert_ne!(a, stream(&mix, 500, 8));
        for c in &a {
            let nb = (G..=4 * G).contains(&c.memory) && (10..=30).contains(&c.sm);
            let tr = (24 * G..=80 * G).contains(&c.memory) && (50..=100).contains(&c.sm);
            assert!(nb || tr, "{c:?}");
            assert_eq!(c.memory % MEMORY_STEP, 0);
        }
        assert!(a.iter().any(|c| c.memory <= 4 * G) && a.iter().any(|c| c.memory >= 24 * G));
    }
}
