//! Class 6 of issue 11 (part): limits in the environment are read once, when the library is loaded, before the
//! program runs. A program that rewrites its own environment before its first CUDA call (`setenv` is a line of
//! ordinary C) must not raise its cap, switch cuquota off, or move itself to a private usage file. The probe
//! is the `-lcuda` build, so nothing reaches the shim before `cuInit`.

use shim_tests::{Prog, Sim, GIB};

#[test]
fn a_program_that_raises_its_limit_with_setenv_before_cuinit_stays_capped() {
    let sim = Sim::new().build();
    let out = sim
        .cmd(Prog::ProbeDirect)
        .mem_limit("1g")
        .args("setenv:CUDA_DEVICE_MEMORY_LIMIT=0 init alloc:mem:2g simused")
        .run();
    out.ok();
    out.expect("setenv", "0");
    assert_eq!(
        out.val("alloc.0"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "setenv(\"CUDA_DEVICE_MEMORY_LIMIT\", \"0\") before cuInit lifted the 1 GiB cap:{out:?}"
    );
    assert!(out.num("sim.used.0") < GIB, "{out:?}");
}

#[test]
fn a_program_that_opts_out_with_setenv_before_cuinit_stays_capped() {
    let sim = Sim::new().build();
    for var in ["CUDA_DISABLE_CONTROL=true", "CUQUOTA_DISABLE=1"] {
        let out = sim
            .cmd(Prog::ProbeDirect)
            .mem_limit("1g")
            .args(&format!("setenv:{var} init alloc:mem:2g"))
            .run();
        out.ok();
        assert_eq!(
            out.val("alloc.0"),
            "CUDA_ERROR_OUT_OF_MEMORY",
            "setenv({var}) before cuInit switched cuquota off:{out:?}"
        );
    }
}

#[test]
fn a_program_that_moves_to_a_private_usage_file_with_setenv_still_shares_the_cap() {
    let sim = Sim::new().build();
    let mut holder = sim
        .cmd(Prog::ProbeDirect)
        .mem_limit("1g")
        .args("init alloc:mem:700m wait")
        .spawn();
    holder.wait_ready(1);
    let private = sim.dir().join("private-usage");
    let out = sim
        .cmd(Prog::ProbeDirect)
        .mem_limit("1g")
        .args(&format!(
            "setenv:CUQUOTA_USAGE_FILE={} init alloc:mem:700m",
            private.display()
        ))
        .run();
    holder.release();
    holder.finish().ok();
    out.ok();
    assert_eq!(
        out.val("alloc.0"),
        "CUDA_ERROR_OUT_OF_MEMORY",
        "setenv(CUQUOTA_USAGE_FILE) to a private file before cuInit escaped the container's shared cap:{out:?}"
    );
}
