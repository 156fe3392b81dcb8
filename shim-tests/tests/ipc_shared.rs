//! #11 class 1, memory shared between processes with CUDA IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle` /
//! `cuIpcCloseMemHandle`), with shareable VMM handles (`cuMemExportToShareableHandle` /
//! `cuMemImportFromShareableHandle`, a POSIX descriptor passed with `SCM_RIGHTS` or a fabric handle's bytes; the
//! same attack with `cuMemRelease` + `cuMemUnmap` as the exporter's letting go) and with pool allocations
//! (`cuMemPoolExportToShareableHandle` / `cuMemPoolImportFromShareableHandle` / `cuMemPoolExportPointer` /
//! `cuMemPoolImportPointer`; the exporter destroys its pool while the importer still holds the allocation). cuda.h calls the exporter's `cuMemFree` before the importers close undefined; a
//! driver that counts references (the simulator models one) keeps the memory for the importer. The attack
//! (`c/ipc_shared.c`): export 512 MiB to a second process of the container, free it, allocate 768 MiB more
//! under a 1 GiB cap. Judged by the simulated GPU's own used bytes (NVML read past the shim): a shim that
//! un-charges at the exporter's free lets the container hold 1280 MiB. The charge of exported memory now lives
//! in the container's shared table (usage region) until its last holder lets go; an import from another
//! container is charged to the importer.

use shim_tests::{compile_c, workspace_root, Output, Sim, GIB, MIB};
use std::path::PathBuf;

const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";
const OK: &str = "CUDA_SUCCESS";

fn attack() -> PathBuf {
    compile_c(
        "ipc_shared",
        &workspace_root().join("shim-tests/c/ipc_shared.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

/// Runs `ipc_shared` with `cmds` under a 1 GiB cap on a fresh 16 GiB simulator; the importer in container
/// `importer` ("default" = the exporter's).
fn run(cmds: &str, importer: &str) -> Output {
    let sim = Sim::new().build();
    let usage = sim.container_usage_file(importer);
    let out = sim
        .cmd_path(attack())
        .mem_limit("1g")
        .env("CQ_IMPORTER_USAGE_FILE", usage.to_str().expect("utf-8 temp path"))
        .args(cmds)
        .run();
    out.ok();
    out
}

#[test]
fn ipc_memory_stays_charged_until_the_importer_closes() {
    let out = run(
        "alloc:0:512m export:0 open:0 free:0 used alloc:1:768m used close used alloc:2:768m used",
        "default",
    );
    out.expect("export.0", OK).expect("open", OK).expect("read", "1");
    out.expect("free.0", OK).expect("close", OK);
    // Freed by its exporter, the 512 MiB live on for the importer...
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    // ...so 768 MiB more does not fit under 1 GiB until the importer closes it.
    out.expect("alloc.1", OOM).expect("alloc.2", OK);
    assert_eq!(out.nth_num("used", 2), 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn both_holding_is_one_charge() {
    // Exporter and importer hold the same 512 MiB: 400 MiB more (by either) still fits under 1 GiB.
    let out = run(
        "alloc:0:512m export:0 open:0 ialloc:256m alloc:1:200m used charged",
        "default",
    );
    out.expect("open", OK).expect("ialloc", OK).expect("alloc.1", OK);
    assert_eq!(out.num("charged"), out.num("used"), "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn an_import_from_another_container_is_charged_to_the_importer() {
    let out = run(
        "alloc:0:512m export:0 open:0 free:0 used ialloc:768m used close ialloc:768m used",
        "other",
    );
    out.expect("open", OK).expect("read", "1").expect("free.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    // The importer's container holds the 512 MiB: 768 MiB more is over its 1 GiB, until it closes them.
    assert_eq!(out.all("ialloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
}

// ---- shareable VMM handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle, POSIX fd) ------

#[test]
fn exported_vmm_memory_stays_charged_until_the_importer_lets_go() {
    let out = run(
        "vcreate:0:512m vexport:0 vfree:0 used alloc:1:768m used vclose used alloc:2:768m used",
        "default",
    );
    out.expect("vcreate.0", OK)
        .expect("vexport.0", OK)
        .expect("vimport", OK)
        .expect("vread", "1");
    out.expect("vfree.0", OK).expect("vclose", OK);
    // Released and unmapped by its creator, the 512 MiB live on, mapped in the importer...
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    // ...so 768 MiB more does not fit under 1 GiB until the importer lets go too.
    out.expect("alloc.1", OOM).expect("alloc.2", OK);
    assert_eq!(out.nth_num("used", 2), 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn both_holding_vmm_memory_is_one_charge() {
    let out = run(
        "vcreate:0:512m vexport:0 ialloc:256m alloc:1:200m used charged",
        "default",
    );
    out.expect("vimport", OK)
        .expect("ialloc", OK)
        .expect("alloc.1", OK);
    assert_eq!(out.num("charged"), out.num("used"), "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn a_vmm_import_from_another_container_is_charged_to_the_importer() {
    let out = run(
        "vcreate:0:512m vexport:0 vfree:0 used ialloc:768m used vclose ialloc:768m used",
        "other",
    );
    out.expect("vimport", OK)
        .expect("vread", "1")
        .expect("vfree.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    // The importer's container holds the 512 MiB (charged at its mapping): 768 MiB more is over its 1 GiB.
    assert_eq!(out.all("ialloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn a_dead_importer_lets_go() {
    // The importer dies holding both kinds of shared memory; once the exporter lets go too, the memory is
    // gone from the GPU and from the charge: 768 MiB fits again.
    let out = run(
        "alloc:0:256m export:0 open:0 vcreate:1:256m vexport:1 kill free:0 vfree:1 used alloc:2:768m used",
        "default",
    );
    out.expect("open", OK).expect("vimport", OK).expect("killed", "1");
    out.expect("free.0", OK)
        .expect("vfree.1", OK)
        .expect("alloc.2", OK);
    assert_eq!(out.nth_num("used", 0), 0, "{out:?}");
    out.assert_used_within(GIB);
}

// ---- fabric handles (CU_MEM_HANDLE_TYPE_FABRIC) -------------------------------------------------------------

#[test]
fn memory_exported_as_a_fabric_handle_stays_charged_until_the_importer_lets_go() {
    let out = run(
        "fcreate:0:512m fexport:0 vfree:0 used alloc:1:768m used vclose used alloc:2:768m used",
        "default",
    );
    out.expect("fcreate.0", OK)
        .expect("fexport.0", OK)
        .expect("fimport", OK)
        .expect("fread", "1");
    out.expect("vfree.0", OK).expect("vclose", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    out.expect("alloc.1", OOM).expect("alloc.2", OK);
    assert_eq!(out.nth_num("used", 2), 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn both_holding_fabric_memory_is_one_charge() {
    let out = run(
        "fcreate:0:512m fexport:0 ialloc:256m alloc:1:200m used charged",
        "default",
    );
    out.expect("fimport", OK)
        .expect("ialloc", OK)
        .expect("alloc.1", OK);
    assert_eq!(out.num("charged"), out.num("used"), "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn a_fabric_import_from_another_container_is_charged_to_the_importer() {
    let out = run(
        "fcreate:0:512m fexport:0 vfree:0 used ialloc:768m used vclose ialloc:768m used",
        "other",
    );
    out.expect("fimport", OK)
        .expect("fread", "1")
        .expect("vfree.0", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    assert_eq!(out.all("ialloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
}

// ---- pool allocations (cuMemPoolExportPointer / cuMemPoolImportPointer) -------------------------------------

#[test]
fn an_exported_pool_allocation_stays_charged_until_the_importer_frees_it() {
    // The exporter destroys its pool with the allocation still imported elsewhere: the pool's charge goes, the
    // imported 512 MiB stay on the GPU and in the container's usage until the importer frees them.
    let out = run(
        "pcreate:0:512m pexport:0 pdestroy used alloc:1:768m used pclose used alloc:2:768m used",
        "default",
    );
    out.expect("pcreate.0", OK)
        .expect("ppool", OK)
        .expect("pexport.0", OK)
        .expect("pimport", OK)
        .expect("pread", "1");
    out.expect("pdestroy", OK).expect("pclose", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    out.expect("alloc.1", OOM).expect("alloc.2", OK);
    assert_eq!(out.nth_num("used", 2), 0, "{out:?}");
    out.assert_used_within(GIB);
}

#[test]
fn both_holding_a_pool_allocation_is_one_charge() {
    // Importer frees first, then the exporter (cuda.h's order): every step one charge, none left at the end.
    let out = run(
        "pcreate:0:512m pexport:0 ialloc:256m alloc:1:200m used charged pclose pfree:0 charged",
        "default",
    );
    out.expect("pimport", OK)
        .expect("ialloc", OK)
        .expect("alloc.1", OK)
        .expect("pclose", OK)
        .expect("pfree.0", OK);
    assert_eq!(out.nth_num("charged", 0), out.nth_num("used", 0), "{out:?}");
    // The freed block was trimmed at the synchronisation: the GPU and the charge are back to the rest.
    assert_eq!(
        out.nth_num("charged", 1),
        out.nth_num("used", 0) - 512 * MIB,
        "{out:?}"
    );
    out.assert_used_within(GIB);
}

#[test]
fn a_pool_import_from_another_container_is_charged_to_the_importer() {
    let out = run(
        "pcreate:0:512m pexport:0 pdestroy used ialloc:768m used pclose ialloc:768m used",
        "other",
    );
    out.expect("pimport", OK)
        .expect("pread", "1")
        .expect("pdestroy", OK);
    assert_eq!(out.nth_num("used", 0), 512 * MIB, "{out:?}");
    assert_eq!(out.all("ialloc"), vec![OOM, OK], "{out:?}");
    out.assert_used_within(GIB);
}
