//! Memory taken at first use lands in the launch's *stream's* context (lazy loading, stack growth) and a
//! module's globals in the *module's* context, whatever context is current: `hooks/context.rs` `first_launch`
//! keys and measures by the stream's context, `first_use` by the module's device. Found by a hostile review
//! (keyed and measured by the current context: up to 4872 MiB under a 1 GiB cap). Judged by the simulator's own
//! used bytes (`c/first_use_streams.c`). Each attack has its control (the same calls with the stream's or
//! module's context current), which holds the cap to one lazy load past it, as docs/threat-model.md says.

use shim_tests::{compile_c, workspace_root, Output, Sim, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "first_use_streams",
        &workspace_root().join("shim-tests/c/first_use_streams.c"),
        &[],
        &["-lcuda", "-ldl"],
    )
}

fn run(sim: &Sim, args: &str) -> Output {
    let out = sim
        .cmd_path(prog())
        .args(args)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .run();
    assert!(out.success(), "{out:?}");
    out
}

fn peak(out: &Output, key: &str) -> u64 {
    out.all(key)
        .iter()
        .map(|u| u.parse::<u64>().unwrap())
        .max()
        .unwrap()
}

/// One device, one CUkernel with a 512 MiB `__device__` global, six contexts with a stream each, the kernel
/// launched onto each stream while the primary context stays current: each launch is a first use in its
/// stream's context, so the second load is measured and the third refused, as in the control with each
/// stream's context current (1028 MiB; before: 3084 MiB after the launches, 3276 MiB after a fill).
#[test]
fn a_kernel_launched_onto_other_contexts_streams_is_admitted_there() {
    let sim = Sim::new().build();
    let control = run(&sim, "same 512m 6 own");
    let c = peak(&control, "used.0");
    println!("control (stream's context current): peak {} MiB", c / MIB);
    assert!(c <= 1100 * MIB, "control:{control:?}");
    let sim = Sim::new().build();
    let attack = run(&sim, "same 512m 6 cross");
    let a = peak(&attack, "used.0");
    println!("attack (primary context current): peak {} MiB", a / MIB);
    assert!(
        a <= 1100 * MIB,
        "lazy loads into other contexts' streams escaped the 1 GiB cap: {} MiB:{attack:?}",
        a / MIB
    );
}

/// Two devices capped at 1 GiB each; four libraries with a 1 GiB global each, their kernels launched onto a
/// stream of device 1 while device 0's context is current: admitted and measured on device 1, as in the control
/// with device 1 current (1026 MiB; before: measured on device 0, 4104 MiB after the loads, 4872 MiB after a
/// fill).
#[test]
fn a_kernel_launched_onto_another_devices_stream_is_measured_on_that_device() {
    let sim = Sim::new().devices(2).build();
    let control = run(&sim, "dev1 1g 4 own");
    let c = peak(&control, "used.1");
    println!("control (device 1 current): peak {} MiB", c / MIB);
    assert!(c <= 1100 * MIB, "control:{control:?}");
    let sim = Sim::new().devices(2).build();
    let attack = run(&sim, "dev1 1g 4 cross");
    let a = peak(&attack, "used.1");
    println!("attack (device 0 current): peak {} MiB on device 1", a / MIB);
    assert!(
        a <= 1100 * MIB,
        "lazy loads on device 1 escaped its 1 GiB cap: {} MiB:{attack:?}",
        a / MIB
    );
}

/// Launch-time stack growth: a kernel with 3010 bytes of local memory a thread (each context's stack grows to
/// it for every thread the device holds, ~512 MiB) launched onto the streams of four contexts while the primary
/// context is current: the growth is asked of each stream's context and admitted (control 962 MiB; before:
/// only the first launch's, 2248 MiB).
#[test]
fn stack_growth_on_other_contexts_streams_is_admitted() {
    let sim = Sim::new().build();
    let control = run(&sim, "same 0 4 own 3010");
    let c = peak(&control, "used.0");
    println!("control (stream's context current): peak {} MiB", c / MIB);
    assert!(c <= 1100 * MIB, "control:{control:?}");
    let sim = Sim::new().build();
    let attack = run(&sim, "same 0 4 cross 3010");
    let a = peak(&attack, "used.0");
    println!("attack (primary context current): peak {} MiB", a / MIB);
    assert!(
        a <= 1100 * MIB,
        "stack growth in other contexts escaped the 1 GiB cap: {} MiB:{attack:?}",
        a / MIB
    );
}

/// `cuModuleGetGlobal`: the driver allocates a module's global in the *module's* context at its first lookup.
/// Four PTX modules with a 1 GiB `.global` each, loaded in device 1's context, looked up with device 0 current:
/// measured on device 1, the rest refused, as in the control (1032 MiB; before: measured on device 0, 4104 MiB
/// after the lookups, 4808 MiB after a fill).
#[test]
fn a_modules_global_looked_up_from_another_device_is_measured_on_its_device() {
    let sim = Sim::new().devices(2).build();
    let control = run(&sim, "modglobal 1g 4 own");
    let c = peak(&control, "used.1");
    println!("control (device 1 current): peak {} MiB", c / MIB);
    assert!(c <= 1100 * MIB, "control:{control:?}");
    let sim = Sim::new().devices(2).build();
    let attack = run(&sim, "modglobal 1g 4 cross");
    let a = peak(&attack, "used.1");
    println!("attack (device 0 current): peak {} MiB on device 1", a / MIB);
    assert!(
        a <= 1100 * MIB,
        "module globals on device 1 escaped its 1 GiB cap: {} MiB:{attack:?}",
        a / MIB
    );
}
