//! #11 class 3, every way to find the real entry points: a tenant under a 1 GiB cap looks for the real
//! `cuMemAlloc_v2` through each route the dynamic loader offers (`c/resolve.c`) and allocates 4 × 512 MiB with
//! what it found. Judged by the simulator's own device-memory figure (read past any interposer), never by the
//! shim's accounting. Before the fix, `dlvsym` with any version string, `dlsym`/`dlvsym` of `dlsym`/`dlvsym`
//! themselves, `dlmopen(LM_ID_NEWLM)` and `dlopen(RTLD_DEEPBIND)` of a library linked with `-lcuda` all
//! handed out the driver's own function and the GPU held 2 GiB.
//!
//! Reading libcuda's own ELF symbol table is not stoppable in-process: `parsing_the_elf_is_not_stopped_in_process`
//! shows what that tenant gets; the node agent catches it (`agent_enforce.rs`, tenants that bypass the library).

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

fn resolve() -> PathBuf {
    compile_c(
        "resolve",
        &workspace_root().join("shim-tests/c/resolve.c"),
        &[],
        &["-ldl"],
    )
}

/// `resolve_lib.c` as a shared library linked with `-lcuda` (NEEDED libcuda.so.1).
fn resolve_lib() -> PathBuf {
    compile_c(
        "libresolve_lib.so",
        &workspace_root().join("shim-tests/c/resolve_lib.c"),
        &[],
        &["-shared", "-fPIC", "-lcuda"],
    )
}

/// Runs one route under a 1 GiB cap: 4 allocations of 512 MiB.
fn attack(route: &str) -> Output {
    attack_on(&Sim::new().build(), route)
}

fn attack_on(sim: &Sim, route: &str) -> Output {
    let lib = resolve_lib();
    let out = sim
        .cmd_path(resolve())
        .mem_limit("1g")
        .arg(route)
        .arg(&(512 * MIB).to_string())
        .arg("4")
        .arg(lib.to_str().unwrap())
        .run();
    assert!(out.status.success() && !out.timed_out, "{out:?}");
    out
}

/// The cap held on the GPU itself: at most 1 GiB used, at most 2 of the 4 allocations served.
#[track_caller]
fn held(route: &str) -> Output {
    let out = attack(route);
    let used = out.num("sim.used");
    assert!(
        used <= GIB,
        "route {route}: the simulated GPU holds {} MiB under a 1 GiB cap:{out:?}",
        used / MIB
    );
    out
}

#[test]
fn the_loaders_own_lookups_found_by_name_are_ours() {
    // dlsym / dlvsym looked up by name (in libc, any version) are ours, so what they find is ours too.
    for route in [
        "dlsym-dlsym",
        "dlvsym-dlsym:GLIBC_2.34",
        "dlvsym-dlsym:GLIBC_2.2.5",
        "dlsym-dlvsym",
        "dlvsym-gpa",
    ] {
        let out = held(route);
        out.expect("found", "1").expect("alloc.ok", "2");
    }
}

#[test]
fn dlvsym_of_a_hooked_name_with_a_version_the_library_defines_is_ours() {
    // A library with version definitions (resolve_versioned.c: cuMemAlloc_v2@@CUQUOTA_TEST_1): glibc's dlvsym
    // finds its function; ours comes back instead.
    let dir = shim_tests::target_dir().join("shim-tests-c");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("resolve_versioned.map");
    std::fs::write(&script, "CUQUOTA_TEST_1 { global: cuMemAlloc_v2; local: *; };\n").unwrap();
    let lib = compile_c(
        "libresolve_versioned.so",
        &workspace_root().join("shim-tests/c/resolve_versioned.c"),
        &[],
        &[
            "-shared",
            "-fPIC",
            &format!("-Wl,--version-script={}", script.display()),
        ],
    );
    let sim = Sim::new().build();
    let out = sim
        .cmd_path(resolve())
        .mem_limit("1g")
        .args("dlvsym-versioned 0 0")
        .arg(lib.to_str().unwrap())
        .run();
    assert!(out.status.success(), "{out:?}");
    out.expect("found", "1").expect("ours", "1");
}

#[test]
fn dlvsym_of_a_hooked_name_never_hands_out_the_drivers_function() {
    // glibc's dlvsym finds no unversioned symbol (the simulator's, like a library built without version
    // definitions): not found stays not found. Where the library defines versions, what it finds is ours.
    for route in [
        "dlvsym-lib:bogus",
        "dlvsym-lib:GLIBC_2.34",
        "dlvsym-default:bogus",
        "dlvsym-next:bogus",
    ] {
        let out = held(route);
        if out.val("found") == "1" {
            out.expect("alloc.ok", "2");
        }
    }
}

#[test]
fn cu_get_proc_address_with_every_flag_and_version_hands_out_ours() {
    // Already hooked before #11 (a regression guard, not a reproduction): the driver picks the function, the
    // reverse map swaps it for ours, whatever the version, the stream flag or the entry point.
    for route in [
        "gpa:3020:0",
        "gpa:12000:0",
        "gpa:13000:0",
        "gpa:12000:1",
        "gpa:12000:2",
        "gpa1:11030:0",
        "gpa1:12000:2",
        "gpa-gpa",
    ] {
        let out = held(route);
        out.expect("found", "1").expect("alloc.ok", "2");
    }
}

#[test]
fn dlmopen_into_a_new_namespace_is_refused_with_a_clear_error() {
    for route in ["dlmopen-cuda", "dlmopen-lib"] {
        let out = held(route);
        out.expect("found", "0");
        let e = out.val("open.error");
        assert!(
            e.contains("cuquota") && e.contains("dlmopen"),
            "route {route}: dlerror does not say who refused what: {e}"
        );
    }
}

#[test]
fn a_deepbind_library_linked_with_libcuda_still_binds_to_the_hooks() {
    let out = held("deepbind-lib");
    out.expect("found", "1").expect("alloc.ok", "2");
}

#[test]
fn parsing_the_elf_is_not_stopped_in_process() {
    // The documented hole (docs/threat-model.md): the driver's own function, past the cap. The node agent is
    // what stops this tenant (agent_enforce.rs).
    let out = attack("elf");
    out.expect("found", "1").expect("alloc.ok", "4");
    assert_eq!(out.num("sim.used"), 2 * GIB, "{out:?}");
}

#[test]
fn a_primary_context_from_the_runtimes_export_table_is_charged_before_allocations() {
    // cuGetExportTable's CUDART_INTERFACE slot 2 retains the primary context inside the driver (as the CUDA
    // runtime gets it), past cuDevicePrimaryCtxRetain. Before the fix its 512 MiB were charged only at the
    // next measurement (a context creation, module or library load), so two 512 MiB allocations fit under the
    // 1 GiB cap on top of it and the GPU held 1.5 GiB. The first allocation in a context the shim did not see
    // created now measures it first.
    for route in ["export-table", "export-table-async"] {
        let sim = Sim::new().ctx_overhead("512m").build();
        let out = attack_on(&sim, route);
        out.expect("found", "1").expect("alloc.ok", "1");
        assert_eq!(out.num("sim.used"), GIB, "{route}: {out:?}");
    }
}

#[test]
fn an_audit_library_that_vetoes_the_preload_is_not_stopped_in_process() {
    // The documented hole (docs/threat-model.md): a process started with LD_AUDIT can refuse to load the
    // preload (la_objsearch) before any of its code runs. Only the agent stops this tenant.
    let audit = compile_c(
        "libresolve_audit.so",
        &workspace_root().join("shim-tests/c/resolve_audit.c"),
        &[],
        &["-shared", "-fPIC"],
    );
    let sim = Sim::new().build();
    let out = sim
        .cmd_path(resolve())
        .mem_limit("1g")
        .env("LD_AUDIT", audit.to_str().unwrap())
        .arg("dlsym")
        .arg(&(512 * MIB).to_string())
        .arg("4")
        .run();
    assert!(out.status.success(), "{out:?}");
    out.expect("found", "1").expect("alloc.ok", "4");
    assert_eq!(out.num("sim.used"), 2 * GIB, "{out:?}");
    // Without the audit library the same program is held.
    held("dlsym").expect("alloc.ok", "2");
}
