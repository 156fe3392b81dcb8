//! Memory taken at first use lands in the launch's *stream's* context (lazy loading, stack growth) and a
//! module's globals in the *module's* context, whatever context is current: `hooks/context.rs` `first_launch`
//! keys and measures by the stream's context, `first_use` by the module's device. Found by a hostile review
//! (keyed and measured by the current context: up to 4872 MiB under a 1 GiB cap). Judged by the simulator's own
//! used bytes (`c/first_use_streams.c`). Each attack (`cross`: another context current) beside its control
//! (`own`: the stream's or module's context current), which holds the cap to one lazy load past it, as
//! docs/threat-model.md says.

use shim_tests::{compile_c, workspace_root, Sim, MIB};

/// Runs the control and the attack of `args` ("MODE G N", then `local` bytes of local memory a thread), each on
/// a fresh simulator of `devices` devices capped at 1 GiB: the peak of `key` stays within one load past the cap.
fn own_and_cross(devices: u32, args: &str, local: &str, key: &str, what: &str) {
    let prog = compile_c(
        "first_use_streams",
        &workspace_root().join("shim-tests/c/first_use_streams.c"),
        &[],
        &["-lcuda", "-ldl"],
    );
    for side in ["own", "cross"] {
        let sim = Sim::new().devices(devices).build();
        let out = sim
            .cmd_path(prog.clone())
            .args(&format!("{args} {side} {local}"))
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .run();
        assert!(out.success(), "{out:?}");
        let p = out.peak(key);
        println!("{side}: peak {} MiB ({key})", p / MIB);
        assert!(
            p <= 1100 * MIB,
            "{side}: {what} escaped the 1 GiB cap: {} MiB:{out:?}",
            p / MIB
        );
    }
}

/// One device, one CUkernel with a 512 MiB `__device__` global, six contexts with a stream each, the kernel
/// launched onto each stream while the primary context stays current: each launch is a first use in its
/// stream's context, so the second load is measured and the third refused, as in the control with each
/// stream's context current (1028 MiB; before: 3084 MiB after the launches, 3276 MiB after a fill).
#[test]
fn a_kernel_launched_onto_other_contexts_streams_is_admitted_there() {
    own_and_cross(1, "same 512m 6", "", "used.0", "lazy loads into other contexts");
}

/// Two devices capped at 1 GiB each; four libraries with a 1 GiB global each, their kernels launched onto a
/// stream of device 1 while device 0's context is current: admitted and measured on device 1, as in the control
/// with device 1 current (1026 MiB; before: measured on device 0, 4104 MiB after the loads, 4872 MiB after a
/// fill).
#[test]
fn a_kernel_launched_onto_another_devices_stream_is_measured_on_that_device() {
    own_and_cross(2, "dev1 1g 4", "", "used.1", "lazy loads on device 1");
}

/// Launch-time stack growth: a kernel with 3010 bytes of local memory a thread (each context's stack grows to
/// it for every thread the device holds, ~512 MiB) launched onto the streams of four contexts while the primary
/// context is current: the growth is asked of each stream's context and admitted (control 962 MiB; before:
/// only the first launch's, 2248 MiB).
#[test]
fn stack_growth_on_other_contexts_streams_is_admitted() {
    own_and_cross(1, "same 0 4", "3010", "used.0", "stack growth in other contexts");
}

/// `cuModuleGetGlobal`: the driver allocates a module's global in the *module's* context at its first lookup.
/// Four PTX modules with a 1 GiB `.global` each, loaded in device 1's context, looked up with device 0 current:
/// measured on device 1, the rest refused, as in the control (1032 MiB; before: measured on device 0, 4104 MiB
/// after the lookups, 4808 MiB after a fill).
#[test]
fn a_modules_global_looked_up_from_another_device_is_measured_on_its_device() {
    own_and_cross(2, "modglobal 1g 4", "", "used.1", "module globals on device 1");
}
