//! Images that lie to the footprint reader (`src/memory/image.rs`) while the driver loads them as it reads them:
//! a hostile review of issue 35 item 2 (`c/first_use_lies.c`). Judged by the simulator's own used bytes, NVML
//! named away (the charge is then the footprint alone) or present (the measurement corrects one load).

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "first_use_lies",
        &workspace_root().join("shim-tests/c/first_use_lies.c"),
        &[],
        &["-lcuda", "-ldl", "-lpthread"],
    )
}

const NO_NVML: (&str, &str) = ("CUQUOTA_LIBNVML", "/nonexistent/libnvidia-ml.so.1");

fn run(args: &str, env: &[(&str, &str)]) -> Output {
    let sim = Sim::new().build();
    let mut c = sim
        .cmd_path(prog())
        .args(args)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .timeout(std::time::Duration::from_secs(60));
    for (k, v) in env {
        c = c.env(k, v);
    }
    let out = c.run();
    assert!(out.success(), "{args}:{out:?}");
    println!("{args} {env:?}: peak {} MiB", out.peak("used") / MIB);
    out
}

/// CONTROL: eight plain cubins of a 512 MiB global without NVML: the footprint keeps them under the cap.
#[test]
fn plain_cubins_without_nvml_stay_under_the_cap() {
    let out = run("honest 512m 8", &[NO_NVML]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    out.assert_used_within(GIB);
}

/// A cubin whose section names lie past its `.shstrtab` (the driver reads them there) and whose `.nv.global`
/// is not SHF_ALLOC: the global's symbol still counts, whatever its section looks like.
#[test]
fn a_cubin_hiding_its_globals_section_is_still_charged_its_symbols() {
    let out = run("noname 512m 8", &[NO_NVML]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    out.assert_used_within(GIB);
}

/// Sizes that overflow (an object symbol of 2^64-1 bytes the driver never allocates) make the footprint huge,
/// not unknown: the first use of a 3 GiB global is refused up front, NVML present or not.
#[test]
fn a_cubin_whose_sizes_overflow_is_refused_not_unknown() {
    for env in [&[][..], &[NO_NVML][..]] {
        let out = run("overflow 3g 1", env);
        assert_eq!(
            out.get("global.0"),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{env:?}:{out:?}"
        );
        out.assert_used_within(GIB);
    }
}

/// PTX whose other declaration has a hex dimension (`pad[0x10]`): the 3 GiB global beside it is still read and
/// refused up front.
#[test]
fn ptx_with_a_hex_dimension_is_read() {
    let out = run("ptxhex 3g 1", &[]);
    assert_eq!(out.get("global.0"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(GIB);
}

/// CONTROL for leaks: a 512 MiB module loaded, looked up and unloaded sixteen times without NVML: each unload
/// gives its charge back, so none is refused.
#[test]
fn reloading_a_module_gives_its_charge_back() {
    let out = run("reload 512m 16", &[NO_NVML]);
    for i in 0..16 {
        assert_eq!(
            out.get(&format!("global.{i}")),
            Some("CUDA_SUCCESS"),
            "{i}:{out:?}"
        );
    }
    out.assert_used_within(GIB);
}

/// `cuModuleLoad` of a FIFO: the driver reads a 512 MiB global's cubin, the library's own read of the file after
/// the call gets a 1-byte one. Without NVML the footprint must be of what the driver loaded.
#[test]
fn a_file_read_twice_cannot_show_the_library_another_image() {
    let out = run("fifo 512m 2", &[NO_NVML]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    out.assert_used_within(GIB);
}

/// An honest program loading a module from a pipe (a FIFO written once, as `/dev/stdin` of a pipeline): the
/// load returns, the library's own read of the file does not wait forever for a second writer.
#[test]
fn a_module_loaded_from_a_pipe_does_not_hang() {
    let out = run("pipe 64m 1", &[]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
}

/// CONTROL for the file paths: libraries loaded from a regular file (`cuLibraryLoadFromFile`, now handed to the
/// driver from the library's own read of it) load, and their globals are charged without NVML.
#[test]
fn libraries_from_a_file_are_loaded_and_charged() {
    let out = run("libfile 512m 8", &[NO_NVML]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    assert_eq!(out.get("global.1"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(GIB);
}

/// A library's 256 MiB global looked up in a context that is then destroyed, sixteen times, without NVML (a
/// context costs 256 MiB by the estimate): each context's
/// charge goes with it, so none is refused.
#[test]
fn a_librarys_charge_goes_with_its_context() {
    let out = run("ctxcycle 256m 16", &[NO_NVML]);
    for i in 0..16 {
        assert_eq!(
            out.get(&format!("global.{i}")),
            Some("CUDA_SUCCESS"),
            "{i}:{out:?}"
        );
    }
    out.assert_used_within(GIB);
}

/// Raised by the simulator once a load read its image from the program's memory (`CUDASIM_LOADED_SIGNAL`):
/// SIGUSR1, whose handler in `flip` / `libflip` shrinks the image's global to 1 byte.
const FLIPPED: (&str, &str) = ("CUDASIM_LOADED_SIGNAL", "10");

/// An image rewritten between the driver's read and the load's return (deterministically, where another thread
/// rewriting it would land there only sometimes): the driver loaded 512 MiB globals, the program's memory
/// then says 1 byte. The footprint is of what the driver was handed, the library's own copy, so without NVML
/// the second global is refused, as for an honest image.
#[test]
fn an_image_rewritten_during_its_load_is_charged_as_the_driver_loaded_it() {
    for mode in ["flip 512m 8", "libflip 512m 8"] {
        let out = run(mode, &[NO_NVML, FLIPPED]);
        assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{mode}:{out:?}");
        assert_eq!(
            out.get("global.1"),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{mode}:{out:?}"
        );
        out.assert_used_within(GIB);
    }
}

/// CONTROL: the same images loaded with no rewrite (the second 512 MiB global refused, as on any build), and
/// rewritten after the driver read them at 64 MiB (each load and lookup works: the program's image after its
/// load is not what the driver or the library use).
#[test]
fn images_copied_for_their_load_load_as_before() {
    for mode in ["flip 512m 8", "libflip 512m 8"] {
        let out = run(mode, &[NO_NVML]);
        assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{mode}:{out:?}");
        assert_eq!(
            out.get("global.1"),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{mode}:{out:?}"
        );
        out.assert_used_within(GIB);
    }
    for mode in ["flip 64m 4", "libflip 64m 4"] {
        let out = run(mode, &[NO_NVML, FLIPPED]);
        for i in 0..4 {
            assert_eq!(
                out.get(&format!("global.{i}")),
                Some("CUDA_SUCCESS"),
                "{mode} {i}:{out:?}"
            );
        }
        out.assert_used_within(GIB);
    }
}

/// A fat binary whose sm_80 entry is no ELF beside an sm_90 cubin of a 3 GiB global: the driver never reads
/// another GPU's entry, so the image is read for the device's (compute capability 9.0) and the first use is
/// refused up front, NVML present or not (on main the junk made the whole image unknown: 3074 MiB held).
#[test]
fn another_gpus_unreadable_entry_does_not_hide_the_devices() {
    for env in [&[][..], &[NO_NVML][..]] {
        let out = run("fatjunk 3g 1", env);
        assert_eq!(
            out.get("global.0"),
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            "{env:?}:{out:?}"
        );
        out.assert_used_within(GIB);
    }
}

/// CONTROL: the unreadable entry is PTX the device could JIT-compile (compute_80 on 9.0): the image stays
/// unknown and, with NVML, is measured after its first use: one load past the cap at most, as documented.
#[test]
fn an_unreadable_entry_the_device_could_load_keeps_the_image_unknown() {
    let out = run("fatptxjunk 768m 4", &[]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    assert_eq!(
        out.get("global.1"),
        Some("CUDA_SUCCESS"),
        "unknown: admitted, measured after: {out:?}"
    );
    let peak = out.peak("used");
    assert!(
        peak > GIB && peak <= GIB + 768 * MIB + 64 * MIB,
        "one load past the cap: {} MiB",
        peak / MIB
    );
}

/// CONTROL: a normal multi-architecture fat binary (sm_80 and sm_90 cubins) loads, its sm_90 global is read
/// and charged, and eight of them stay under the cap without NVML.
#[test]
fn a_multi_arch_fat_binary_is_read_for_the_devices_entry() {
    let out = run("fatmulti 512m 8", &[NO_NVML]);
    assert_eq!(out.get("global.0"), Some("CUDA_SUCCESS"), "{out:?}");
    assert_eq!(out.get("global.1"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{out:?}");
    out.assert_used_within(GIB);
}
