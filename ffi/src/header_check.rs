//! Every CUDA and NVML signature, type, struct layout and constant this crate declares, checked against NVIDIA's
//! headers (`.deps/cu13/nvidia/cu13/include`, the pinned wheels `scripts/setup.sh` installs): a C file generated
//! from the same lists that generate the function tables (and, in the preload library, the exports) is compiled
//! with `-Werror`; it
//! - declares each function with our signature (Rust types spelled in C) and `_Static_assert`s that its type
//!   is the header's: `PFN_<name>_v<version>[_ptsz]` from `cudaTypedefs.h`, the `nvml.h` prototype;
//! - declares `dlsym`, `dlvsym`, `dlopen`, `dlmopen` as the preload library exports them and asserts glibc's
//!   `dlfcn.h` agrees, and `nvmlErrorString` as `nvml::PFN_nvmlErrorString` spells it;
//! - asserts the size (and, for integers, signedness) of every type alias, the size and every field offset and
//!   size of every struct we mirror, and the value of every constant and result code.
//!
//! A new line in a list, a new constant or struct is checked without touching this file.

use crate::{self as ffi, AliasCheck, FunctionCheck, StructCheck};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

fn cuda_functions() -> Vec<FunctionCheck> {
    crate::cuda::checked_functions()
}

fn nvml_functions() -> Vec<FunctionCheck> {
    crate::nvml::checked_functions()
}

/// A Rust type as written in our signatures → the same type in C.
fn c_type(rust: &str) -> String {
    let t = rust.trim();
    let pointee = |kind: &str| Some(t.strip_prefix('*')?.trim_start().strip_prefix(kind)?.to_string());
    if let Some(inner) = pointee("mut ") {
        return format!("{} *", c_type(&inner));
    }
    if let Some(inner) = pointee("const ") {
        let inner = c_type(&inner);
        return if inner.ends_with('*') {
            format!("{inner} const *")
        } else {
            format!("const {inner} *")
        };
    }
    match t {
        "c_void" => "void",
        "c_char" => "char",
        "c_int" | "i32" => "int",
        "c_long" => "long",
        "c_uint" | "u32" => "unsigned int",
        "u8" => "unsigned char",
        "u16" => "unsigned short",
        "usize" => "size_t",
        "u64" => "unsigned long long",
        "f32" => "float",
        other => other, // a header type of the same name
    }
    .to_string()
}

/// `cuMemAlloc_v2` @3020 → `PFN_cuMemAlloc_v3020`; `cuLaunchKernel_ptsz` @7000 → `PFN_cuLaunchKernel_v7000_ptsz`;
/// `cuMemcpyHtoD_v2_ptds` @7000 → `PFN_cuMemcpyHtoD_v7000_ptds`.
fn pfn_name(name: &str, version: u32) -> String {
    let (base, suffix) = match (name.strip_suffix("_ptsz"), name.strip_suffix("_ptds")) {
        (Some(b), _) => (b, "_ptsz"),
        (_, Some(b)) => (b, "_ptds"),
        _ => (name, ""),
    };
    let base = match base.rsplit_once("_v") {
        Some((b, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => base,
    };
    format!("PFN_{base}_v{version}{suffix}")
}

fn declare(out: &mut String, ret: &str, f: &FunctionCheck) {
    let params: Vec<String> = f.args.iter().map(|(n, t)| format!("{} {n}", c_type(t))).collect();
    let params = if params.is_empty() {
        "void".to_string()
    } else {
        params.join(", ")
    };
    writeln!(out, "{ret} cuquota_{}({params});", f.name).unwrap();
}

fn aliases(out: &mut String, list: Vec<AliasCheck>) {
    for (name, size, signed, opaque) in list {
        if opaque {
            continue;
        }
        writeln!(
            out,
            "_Static_assert(sizeof({name}) == {size}, \"size of {name}\");"
        )
        .unwrap();
        match signed {
            // Signedness of plain integers only: an enum's underlying type is the compiler's choice.
            Some(s) => writeln!(
                out,
                "_Static_assert(__builtin_classify_type(({name})0) != 1 || ((({name})-1 < 0) == {}), \
                 \"signedness of {name}\");",
                s as u8
            ),
            None => writeln!(
                out,
                "_Static_assert(__builtin_classify_type(({name})0) == 5, \"{name} is a pointer\");"
            ),
        }
        .unwrap();
    }
}

fn structs(out: &mut String, list: Vec<StructCheck>) {
    for s in list {
        let c = s.c;
        writeln!(out, "_Static_assert(sizeof({c}) == {}, \"size of {c}\");", s.size).unwrap();
        for (f, offset, size) in s.fields {
            writeln!(
                out,
                "_Static_assert(offsetof({c}, {f}) == {offset} && sizeof((({c} *)0)->{f}) == {size}, \
                 \"{c}.{f}\");"
            )
            .unwrap();
        }
    }
}

fn values(out: &mut String, list: Vec<(&'static str, i128)>) {
    for (c, v) in list {
        writeln!(
            out,
            "_Static_assert((long long)({c}) == {v}LL, \"value of {c}\");"
        )
        .unwrap();
    }
}

/// The whole check as C source.
fn c_source() -> String {
    let mut out = String::from(
        "/* Generated by ffi/src/header_check.rs: the shim's declarations against NVIDIA's headers. */\n\
         #define __CUDA_API_VERSION_INTERNAL 1 /* the legacy (v1 ABI) declarations and typedefs */\n\
         #define NVML_NO_UNVERSIONED_FUNC_DEFS 1 /* NVML's bare and _v2 names as themselves */\n\
         #define _GNU_SOURCE 1 /* dlvsym, dlmopen */\n\
         #include <stddef.h>\n#include <dlfcn.h>\n#include <cuda.h>\n#include <cudaTypedefs.h>\n#include <nvml.h>\n\n",
    );
    for (name, args) in crate::dlfcn::SIGNATURES {
        let params: Vec<String> = args.iter().map(|t| c_type(t)).collect();
        writeln!(out, "void * cuquota_{name}({});", params.join(", ")).unwrap();
        writeln!(
            out,
            "_Static_assert(__builtin_types_compatible_p(__typeof__(&{name}), __typeof__(&cuquota_{name})), \
             \"{name}: our signature is not dlfcn.h's\");"
        )
        .unwrap();
    }
    for (name, ret, args) in crate::nvml::OTHER_SIGNATURES {
        let params: Vec<String> = args.iter().map(|t| c_type(t)).collect();
        writeln!(out, "{} cuquota_{name}({});", c_type(ret), params.join(", ")).unwrap();
        writeln!(
            out,
            "_Static_assert(__builtin_types_compatible_p(__typeof__(&{name}), __typeof__(&cuquota_{name})), \
             \"{name}: our signature is not nvml.h's\");"
        )
        .unwrap();
    }
    for f in cuda_functions() {
        declare(&mut out, "CUresult", &f);
        let pfn = pfn_name(f.name, f.version.expect("a CUDA line without @version"));
        writeln!(
            out,
            "_Static_assert(__builtin_types_compatible_p({pfn}, __typeof__(&cuquota_{n})), \
             \"{n}: our signature is not {pfn}'s\");",
            n = f.name
        )
        .unwrap();
    }
    for f in nvml_functions() {
        declare(&mut out, "nvmlReturn_t", &f);
        writeln!(
            out,
            "_Static_assert(__builtin_types_compatible_p(__typeof__(&{n}), __typeof__(&cuquota_{n})), \
             \"{n}: our signature is not nvml.h's\");",
            n = f.name
        )
        .unwrap();
    }
    aliases(&mut out, ffi::cuda::checked_aliases());
    aliases(&mut out, ffi::nvml::checked_aliases());
    for (t, size) in [
        ("CUresult", std::mem::size_of::<ffi::cuda::CUresult>()),
        ("nvmlReturn_t", std::mem::size_of::<ffi::nvml::nvmlReturn_t>()),
    ] {
        writeln!(out, "_Static_assert(sizeof({t}) == {size}, \"size of {t}\");").unwrap();
    }
    structs(&mut out, ffi::cuda::checked_structs());
    structs(&mut out, ffi::nvml::checked_structs());
    values(&mut out, ffi::cuda::checked_consts());
    values(&mut out, ffi::cuda::checked_results());
    values(&mut out, ffi::nvml::checked_consts());
    values(&mut out, ffi::nvml::checked_results());
    out
}

fn include_dir() -> PathBuf {
    // Where scripts/setup.sh puts the pinned cu13 wheels (as shim-tests' `include_dir`).
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.deps/cu13/nvidia/cu13/include");
    assert!(
        p.join("cuda.h").exists() && p.join("cudaTypedefs.h").exists() && p.join("nvml.h").exists(),
        "NVIDIA headers not found in {}: run scripts/setup.sh (./test.sh runs it first)",
        p.display()
    );
    p
}

/// Compiles `source` against the headers; `Err(compiler output)` when it does not compile.
fn compile(source: &str, tag: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("cuquota-header-check-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("check.c");
    std::fs::write(&src, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-fsyntax-only", "-I"])
        .arg(include_dir())
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn our_declarations_match_nvidias_headers() {
    let src = c_source();
    let functions = cuda_functions().len()
        + nvml_functions().len()
        + crate::dlfcn::SIGNATURES.len()
        + crate::nvml::OTHER_SIGNATURES.len();
    assert_eq!(src.matches("__builtin_types_compatible_p").count(), functions);
    if let Err(e) = compile(&src, "all") {
        panic!("the shim's declarations disagree with NVIDIA's headers:\n{e}");
    }
}

#[test]
fn a_wrong_signature_layout_or_value_fails_the_check() {
    let src = c_source();
    // cuMemAlloc_v2 with a 32-bit size, a struct field at another offset, a constant with another value.
    for (what, from, to) in [
        (
            "signature",
            "CUresult cuquota_cuMemAlloc_v2(CUdeviceptr * dptr, size_t bytesize);",
            "CUresult cuquota_cuMemAlloc_v2(CUdeviceptr * dptr, unsigned int bytesize);",
        ),
        (
            "nvml signature",
            "nvmlReturn_t cuquota_nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int * index);",
            "nvmlReturn_t cuquota_nvmlDeviceGetIndex(nvmlDevice_t device, int * index);",
        ),
        (
            "nvmlErrorString signature",
            "const char * cuquota_nvmlErrorString(nvmlReturn_t);",
            "char * cuquota_nvmlErrorString(nvmlReturn_t);",
        ),
        (
            "dlfcn signature",
            "void * cuquota_dlmopen(long, const char *, int);",
            "void * cuquota_dlmopen(int, const char *, int);",
        ),
        (
            "layout",
            "offsetof(CUmemPoolProps, maxSize) == 24",
            "offsetof(CUmemPoolProps, maxSize) == 16",
        ),
        (
            "value",
            "(long long)(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 5LL",
            "(long long)(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 6LL",
        ),
    ] {
        assert!(src.contains(from), "{what}: {from:?} not in the generated check");
        let broken = src.replace(from, to);
        let e = compile(&broken, what).expect_err(what);
        assert!(e.contains("static assertion failed"), "{what}: {e}");
    }
}

#[test]
fn rust_types_are_spelled_as_in_c() {
    assert_eq!(c_type("*mut *mut c_void"), "void * *");
    assert_eq!(c_type("*const c_char"), "const char *");
    assert_eq!(
        c_type("*const CUDA_ARRAY_DESCRIPTOR"),
        "const CUDA_ARRAY_DESCRIPTOR *"
    );
    assert_eq!(c_type("usize"), "size_t");
    assert_eq!(pfn_name("cuMemAlloc_v2", 3020), "PFN_cuMemAlloc_v3020");
    assert_eq!(
        pfn_name("cuLaunchKernel_ptsz", 7000),
        "PFN_cuLaunchKernel_v7000_ptsz"
    );
    assert_eq!(
        pfn_name("cuMemcpyHtoD_v2_ptds", 7000),
        "PFN_cuMemcpyHtoD_v7000_ptds"
    );
    assert_eq!(pfn_name("cuCtxCreate_v4", 12050), "PFN_cuCtxCreate_v12050");
    assert_eq!(pfn_name("cuInit", 2000), "PFN_cuInit_v2000");
}
