//! Driver faults (the simulator's fault injection, `CUDASIM_FAULT`): whatever error the driver returns — out of
//! memory, invalid context, not initialised, a lost device — the program sees it unchanged through the shim, and
//! the accounting stays exact: a failed allocation leaves no charge behind, a failed free keeps its charge (the
//! memory is still held), a failed context creation or module load charges no overhead.
//!
//! "Exact" is checked against the driver itself: with no context overhead, what the shim has charged the
//! container (`cap − cuMemGetInfo's free`) equals what the simulator holds for the process (`simused`, read
//! past the shim).

use shim_tests::{Output, Prog, Sim, MIB};

/// Each allocation API of `probe`: its kind, the driver function that allocates, the one that frees.
const APIS: &[(&str, &str, &str)] = &[
    ("mem", "cuMemAlloc_v2", "cuMemFree_v2"),
    ("pitch", "cuMemAllocPitch_v2", "cuMemFree_v2"),
    ("managed", "cuMemAllocManaged", "cuMemFree_v2"),
    ("async", "cuMemAllocAsync", "cuMemFreeAsync"),
    ("pool", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"),
    ("vmm", "cuMemCreate", "cuMemRelease"),
    ("array", "cuArrayCreate_v2", "cuArrayDestroy"),
    ("array3d", "cuArray3DCreate_v2", "cuArrayDestroy"),
    ("mipmap", "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy"),
];

/// The errors injected, as `CUDASIM_FAULT` names them and as the program prints them.
const ERRORS: &[(&str, &str)] = &[
    ("OUT_OF_MEMORY", "CUDA_ERROR_OUT_OF_MEMORY"),
    ("INVALID_CONTEXT", "CUDA_ERROR_INVALID_CONTEXT"),
    ("NOT_INITIALIZED", "CUDA_ERROR_NOT_INITIALIZED"),
    ("DEVICE_LOST", "CUDA_ERROR_UNKNOWN"),
];

const CAP: u64 = 1024 * MIB;

/// What the shim has charged the container, and what the driver holds, at the `n`-th `info` / `simused`.
fn charged_and_held(out: &Output, n: usize) -> (u64, u64) {
    (CAP - out.nth_num("info.free", n), out.nth_num("sim.used.0", n))
}

#[test]
fn a_failed_allocation_returns_the_drivers_error_and_leaves_no_charge() {
    let sim = Sim::new().build();
    for &(kind, alloc, _) in APIS {
        // Calls 2..=5 fail, one error each; 1 and 6 succeed. (`trim` returns what a pool keeps reserved.)
        let faults: Vec<String> = ERRORS
            .iter()
            .enumerate()
            .map(|(i, (e, _))| format!("{alloc}:{}:{e}", i + 2))
            .collect();
        let allocs = format!("alloc:{kind}:64m ").repeat(6);
        let line = format!("init {allocs} info simused freeall trim info simused");
        let run = |preload: bool| {
            let mut c = sim
                .cmd(Prog::Probe)
                .env("CUDASIM_FAULT", &faults.join(","))
                .mem_limit("1g")
                .args(&line);
            if !preload {
                c = c.no_preload();
            }
            let out = c.run();
            out.ok();
            out
        };
        let (bare, out) = (run(false), run(true));
        for i in 0..6 {
            let key = format!("alloc.{i}");
            let want = match i {
                1..=4 => ERRORS[i - 1].1,
                _ => "CUDA_SUCCESS",
            };
            assert_eq!(bare.val(&key), want, "{kind}: the driver alone:{bare:?}");
            assert_eq!(out.val(&key), want, "{kind}: through the shim:{out:?}");
        }
        let (charged, held) = charged_and_held(&out, 0);
        assert!(held > 0, "{kind}: nothing allocated?{out:?}");
        assert_eq!(
            charged, held,
            "{kind}: the shim charges {charged} while the driver holds {held}:{out:?}"
        );
        assert_eq!(
            charged_and_held(&out, 1),
            (0, 0),
            "{kind}: not back to zero:{out:?}"
        );
    }
}

#[test]
fn a_failed_free_keeps_its_charge_until_a_free_succeeds() {
    let sim = Sim::new().build();
    for &(kind, _, free) in APIS {
        for &(err, printed) in ERRORS {
            let out = sim
                .cmd(Prog::Probe)
                .env("CUDASIM_FAULT", &format!("{free}:1:{err}"))
                .mem_limit("1g")
                .args(&format!(
                    "init alloc:{kind}:64m alloc:{kind}:64m free:0 info simused free:0 trim info simused"
                ))
                .run();
            out.ok();
            out.expect("free.0", "CUDA_SUCCESS"); // the retry (the last value printed)
            assert_eq!(
                out.all("free.0"),
                vec![printed, "CUDA_SUCCESS"],
                "{kind}/{err}:{out:?}"
            );
            let (charged, held) = charged_and_held(&out, 0);
            assert_eq!(
                charged, held,
                "{kind}/{err}: after the failed free the shim charges {charged}, the driver holds {held}:{out:?}"
            );
            let (after, held_after) = charged_and_held(&out, 1);
            assert_eq!(after, held_after, "{kind}/{err}:{out:?}");
            assert!(
                after < charged,
                "{kind}/{err}: the retried free (and trim) returned nothing:{out:?}"
            );
        }
    }
}

#[test]
fn a_failed_context_or_module_charges_no_overhead() {
    let sim = Sim::new().ctx_overhead("256m").module_overhead("2m").build();
    for &(err, printed) in ERRORS {
        let out = sim
            .cmd(Prog::Probe)
            .env(
                "CUDASIM_FAULT",
                &format!("cuDevicePrimaryCtxRetain:1:{err},cuModuleLoadData:1:{err}"),
            )
            .mem_limit("1g")
            .args("init dev:0 info simused module info simused module info simused")
            .run();
        out.ok();
        out.expect("ctx", printed).expect("dev.0", "CUDA_SUCCESS");
        assert_eq!(out.all("module"), vec![printed, "CUDA_SUCCESS"], "{out:?}");
        // One context charged once; the failed module nothing; the loaded one its 2m.
        assert_eq!(charged_and_held(&out, 0), (256 * MIB, 256 * MIB), "{err}:{out:?}");
        assert_eq!(charged_and_held(&out, 1), (256 * MIB, 256 * MIB), "{err}:{out:?}");
        assert_eq!(charged_and_held(&out, 2), (258 * MIB, 258 * MIB), "{err}:{out:?}");
    }
}

#[test]
fn queries_pass_the_drivers_error_through() {
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::Probe)
        .env(
            "CUDASIM_FAULT",
            "cuMemGetInfo_v2:1:DEVICE_LOST,cuDeviceTotalMem_v2:1:NOT_INITIALIZED",
        )
        .mem_limit("1g")
        .args("init info totalmem info totalmem")
        .run();
    out.ok();
    assert_eq!(
        out.all("info.rc"),
        vec!["CUDA_ERROR_UNKNOWN", "CUDA_SUCCESS"],
        "{out:?}"
    );
    assert_eq!(
        out.all("totalmem.rc"),
        vec!["CUDA_ERROR_NOT_INITIALIZED", "CUDA_SUCCESS"],
        "{out:?}"
    );
    out.expect("totalmem", &CAP.to_string());

    let out = sim
        .cmd(Prog::NvmlProbe)
        .env(
            "CUDASIM_FAULT",
            "nvmlDeviceGetMemoryInfo:1:GPU_IS_LOST,nvmlDeviceGetMemoryInfo_v2:1:DEVICE_LOST",
        )
        .mem_limit("1g")
        .args("mem:0 mem:0")
        .run();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.all("mem.0.rc"), vec!["15", "0"], "{out:?}");
    assert_eq!(out.all("mem.0.v2.rc"), vec!["15", "0"], "{out:?}");
    assert_eq!(out.num("mem.0.total"), CAP, "{out:?}");
}

/// A small deterministic generator for the random scenario (the test must not depend on an RNG crate's
/// versions to reproduce).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn random_faults_on_every_allocation_and_free_path_leave_the_accounting_exact() {
    let sim = Sim::new().build();
    let mut faults: Vec<String> = Vec::new();
    for &(_, alloc, free) in APIS {
        for f in [alloc, free] {
            let rule = format!("{f}:random(0.3):OUT_OF_MEMORY");
            if !faults.contains(&rule) {
                faults.push(rule);
            }
        }
    }
    for seed in 1..=4u64 {
        let mut rng = Lcg(seed);
        let mut cmds = vec!["init".to_string()];
        let mut n = 0;
        for _ in 0..160 {
            if n > 0 && rng.next(3) == 0 {
                cmds.push(format!("free:{}", rng.next(n)));
            } else {
                let (kind, _, _) = APIS[rng.next(APIS.len() as u64) as usize];
                cmds.push(format!("alloc:{kind}:{}m", 2 + 2 * rng.next(8)));
                n += 1;
            }
        }
        cmds.extend(
            [
                "info", "simused", "freeall", "freeall", "freeall", "freeall", "trim",
            ]
            .map(String::from),
        );
        cmds.extend(["info", "simused"].map(String::from));
        let out = sim
            .cmd(Prog::Probe)
            .env("CUDASIM_FAULT", &faults.join(","))
            .env("CUDASIM_FAULT_SEED", &seed.to_string())
            .mem_limit("1g")
            .args(&cmds.join(" "))
            .run();
        out.ok();
        let failed = out
            .lines
            .iter()
            .filter(|l| l.starts_with("alloc.") || l.starts_with("free."))
            .filter(|l| l.ends_with("CUDA_ERROR_OUT_OF_MEMORY"))
            .count();
        assert!(failed >= 10, "seed {seed}: only {failed} faults fired:{out:?}");
        let (charged, held) = charged_and_held(&out, 0);
        assert_eq!(charged, held, "seed {seed}:{out:?}");
        let (charged, held) = charged_and_held(&out, 1);
        assert_eq!(charged, held, "seed {seed}: after the frees:{out:?}");
    }
}
