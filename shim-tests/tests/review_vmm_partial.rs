//! Review of issue 22 (pre-existing at 9b02484, unchanged by the move): a VMM import from another container is
//! charged by the size of its first mapping, not of the allocation (`memory::vmm_ops::Memory::vmm_map`; the
//! hook drops cuMemMap's offset). An importer under a 1 GiB cap maps a 1 GiB import as 4 pieces of 256 MiB and
//! is charged 256 MiB; once the exporter releases its handle the importer holds 1 GiB charged as 256 MiB, and
//! 768 MiB more fit. Expected to FAIL while the escape exists (the N = 1 control passes).

use shim_tests::{compile_c, workspace_root, Output, Sim, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "review_vmm_partial",
        &workspace_root().join("shim-tests/c/review_vmm_partial.c"),
        &[],
        &["-DCQ_DIRECT", "-lcuda", "-ldl"],
    )
}

fn run(pieces: &str) -> Output {
    let sim = Sim::new().build();
    let usage = sim.container_usage_file("other");
    let out = sim
        .cmd_path(prog())
        .mem_limit("1g")
        .env("CQ_IMPORTER_USAGE_FILE", usage.to_str().unwrap())
        .args(pieces)
        .run();
    println!("{out:?}");
    out.expect("create", "CUDA_SUCCESS")
        .expect("import", "CUDA_SUCCESS")
        .expect("map", "CUDA_SUCCESS")
        .expect("release", "CUDA_SUCCESS");
    out
}

#[test]
fn control_one_mapping_charges_the_whole_import() {
    let out = run("1");
    out.expect("ialloc", "CUDA_ERROR_OUT_OF_MEMORY");
}

#[test]
fn an_import_mapped_in_pieces_is_charged_for_one_piece() {
    let out = run("4");
    // The importer's container (cap 1 GiB) holds the 1 GiB import and, if admitted, 768 MiB more.
    out.expect("ialloc", "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(out.num("used") <= 1024 * MIB + 512 * MIB, "{out:?}");
}
