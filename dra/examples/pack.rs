//! Scheduling on paper (docs/kubernetes.md, "Packing"): GPUs used when the scheduler packs fractional claims by
//! the slices' `memory` and `sm` capacities, against one whole GPU per claim.
//!
//!     cargo run -p cuquota-dra --example pack -- [CLAIMS] [SEEDS]
//!
//! Nodes of 8 GPUs of 80 GiB; each mix is run with seeds 1..=SEEDS; the table gives the means.

use cuquota_dra::pack::{first_fit, stream, Workload, INFERENCE, NOTEBOOK, TRAINING};

fn main() {
    let mut args = std::env::args().skip(1);
    let claims: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let seeds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let mixes: [(&str, Vec<(Workload, u32)>); 5] = [
        ("notebooks", vec![(NOTEBOOK, 1)]),
        ("inference", vec![(INFERENCE, 1)]),
        ("training", vec![(TRAINING, 1)]),
        ("60/30/10", vec![(NOTEBOOK, 60), (INFERENCE, 30), (TRAINING, 10)]),
        ("20/40/40", vec![(NOTEBOOK, 20), (INFERENCE, 40), (TRAINING, 40)]),
    ];
    println!(
        "{claims} claims, nodes of 8 x 80 GiB, first fit by capacity, mean of seeds 1..={seeds}\n\n\
         | mix (notebook/inference/training) | whole GPUs | GPUs packed | saved | memory granted | SM granted |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for (name, mix) in &mixes {
        let mut gpus = 0.0;
        let mut mem = 0.0;
        let mut sm = 0.0;
        for seed in 1..=seeds {
            let p = first_fit(&stream(mix, claims, seed), 8, 80 << 30);
            gpus += p.gpus as f64;
            mem += p.memory_pct;
            sm += p.sm_pct;
        }
        let n = seeds as f64;
        println!(
            "| {name} | {claims} | {:.1} | {:.0} % | {:.0} % | {:.0} % |",
            gpus / n,
            100.0 - gpus / n * 100.0 / claims as f64,
            mem / n,
            sm / n
        );
    }
}
