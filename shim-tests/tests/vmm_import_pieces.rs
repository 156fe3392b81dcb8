//! A VMM allocation imported from another container is charged to the importer up to the furthest byte any of
//! its mappings reaches (`cuMemMap`'s offset + size), not by its first mapping's size: mapped as 4 pieces of
//! 256 MiB of a 1 GiB import under a 1 GiB cap it was charged 256 MiB, and once the exporter released its
//! handle 768 MiB more fitted (1.75 GiB held; found by the hostile review of issue 22, present since the import
//! accounting). The one-mapping control passes either way.

use shim_tests::{compile_c, workspace_root, Output, Sim, MIB};
use std::path::PathBuf;

fn prog() -> PathBuf {
    compile_c(
        "vmm_import_pieces",
        &workspace_root().join("shim-tests/c/vmm_import_pieces.c"),
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
fn an_import_mapped_in_pieces_is_charged_for_all_of_them() {
    let out = run("4");
    // The importer's container (cap 1 GiB) holds the 1 GiB import and, if admitted, 768 MiB more.
    out.expect("ialloc", "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(out.num("used") <= 1024 * MIB + 512 * MIB, "{out:?}");
}
