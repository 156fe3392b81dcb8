//! cuGetProcAddress: from (base name, requested CUDA version, flags) to the address of an exported symbol.
//!
//! The table (`proc_table.rs`) is generated from cudaTypedefs.h: one row per `PFN_<name>_v<version>[_ptsz]`
//! typedef, naming the exported symbol that implements that ABI. Rows point at the very functions dlsym
//! finds, so both routes give the same address. Selection, as the real driver does it:
//! - only rows with version ≤ the driver version exist (an older driver does not know newer names);
//! - the plain row with the highest version ≤ the requested version is the answer (none: version not
//!   sufficient);
//! - with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, a `_ptsz`/`_ptds` row at least as new replaces it.

/// Which stream semantics a row's symbol has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    Plain,
    PerThread,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcEntry {
    pub name: &'static str,
    pub version: u32,
    pub variant: Variant,
    pub symbol: &'static str,
    pub addr: usize,
}

/// Builds `entries()` from the generated list of (api name, version, variant, exported symbol).
macro_rules! proc_table {
    ($(($name:ident, $ver:literal, $variant:ident, $sym:ident)),* $(,)?) => {
        /// Every row of the table.
        pub(crate) fn entries() -> Vec<$crate::proc_address::ProcEntry> {
            #[allow(unused_imports)]
            use $crate::abi::exports::*;
            vec![$($crate::proc_address::ProcEntry {
                name: stringify!($name),
                version: $ver,
                variant: $crate::proc_address::Variant::$variant,
                symbol: stringify!($sym),
                addr: $sym as *const () as usize,
            }),*]
        }
    };
}
pub(crate) use proc_table;

/// Why a lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LookupError {
    /// No such name (in a driver of this version).
    NotFound,
    /// The name exists, but only in ABIs newer than the requested version.
    VersionNotSufficient,
}

/// Picks the row for `name` at `requested` CUDA version with `per_thread` semantics, on a driver of
/// version `driver`.
pub(crate) fn lookup<'a>(
    table: &'a [ProcEntry],
    name: &str,
    requested: u32,
    per_thread: bool,
    driver: u32,
) -> Result<&'a ProcEntry, LookupError> {
    let rows: Vec<&ProcEntry> = table
        .iter()
        .filter(|e| e.name == name && e.version <= driver)
        .collect();
    if rows.is_empty() {
        return Err(LookupError::NotFound);
    }
    let best = |v: Variant| {
        rows.iter()
            .filter(|e| e.variant == v && e.version <= requested)
            .max_by_key(|e| e.version)
    };
    let plain = best(Variant::Plain).ok_or(LookupError::VersionNotSufficient)?;
    if per_thread {
        if let Some(pt) = best(Variant::PerThread).filter(|pt| pt.version >= plain.version) {
            return Ok(pt);
        }
    }
    Ok(plain)
}

/// The generated table, built once.
pub(crate) fn table() -> &'static [ProcEntry] {
    static TABLE: std::sync::OnceLock<Vec<ProcEntry>> = std::sync::OnceLock::new();
    TABLE.get_or_init(crate::proc_table::entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(name: &str, ver: u32, pt: bool) -> Result<&'a str, LookupError> {
        lookup(table(), name, ver, pt, 13000).map(|e| e.symbol)
    }

    #[test]
    fn abi_versions() {
        assert_eq!(find("cuMemAlloc", 3020, false), Ok("cuMemAlloc_v2"));
        assert_eq!(find("cuMemAlloc", 13000, false), Ok("cuMemAlloc_v2"));
        assert_eq!(find("cuMemAlloc", 3010, false), Ok("cuMemAlloc"));
        assert_eq!(find("cuMemAlloc", 2000, false), Ok("cuMemAlloc"));
        assert_eq!(
            find("cuMemAlloc", 1000, false),
            Err(LookupError::VersionNotSufficient)
        );
        assert_eq!(find("cuCtxCreate", 12000, false), Ok("cuCtxCreate_v3"));
        assert_eq!(find("cuCtxCreate", 13000, false), Ok("cuCtxCreate_v4"));
        assert_eq!(
            find("cuGraphInstantiate", 11000, false),
            Ok("cuGraphInstantiate_v2")
        );
        assert_eq!(
            find("cuGraphInstantiate", 12000, false),
            Ok("cuGraphInstantiateWithFlags")
        );
        assert_eq!(find("cuGetProcAddress", 12000, false), Ok("cuGetProcAddress_v2"));
        assert_eq!(find("cuGetProcAddress", 11030, false), Ok("cuGetProcAddress"));
        assert_eq!(find("cuNoSuchThing", 13000, false), Err(LookupError::NotFound));
    }

    #[test]
    fn per_thread_variants() {
        assert_eq!(find("cuMemcpyHtoD", 13000, true), Ok("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(find("cuMemcpyHtoD", 13000, false), Ok("cuMemcpyHtoD_v2"));
        // Below the version that introduced per-thread streams, the plain one.
        assert_eq!(find("cuMemcpyHtoD", 3020, true), Ok("cuMemcpyHtoD_v2"));
        assert_eq!(find("cuLaunchKernel", 12000, true), Ok("cuLaunchKernel_ptsz"));
        assert_eq!(
            find("cuStreamGetCaptureInfo", 12030, true),
            Ok("cuStreamGetCaptureInfo_v3_ptsz")
        );
        assert_eq!(
            find("cuStreamGetCaptureInfo", 11030, true),
            Ok("cuStreamGetCaptureInfo_v2_ptsz")
        );
        // No per-thread variant: the plain one.
        assert_eq!(find("cuMemAlloc", 13000, true), Ok("cuMemAlloc_v2"));
        assert_eq!(
            find("cuEventElapsedTime", 13000, true),
            Ok("cuEventElapsedTime_v2")
        );
    }

    #[test]
    fn older_driver_does_not_know_newer_names() {
        assert!(
            lookup(table(), "cuCtxCreate", 13000, false, 12000).map(|e| e.symbol) == Ok("cuCtxCreate_v3")
        );
        assert_eq!(
            lookup(table(), "cuLogsCurrent", 12090, false, 12080).map(|e| e.symbol),
            Err(LookupError::NotFound)
        );
    }

    #[test]
    fn every_row_points_at_a_distinct_export_per_symbol() {
        let t = table();
        assert!(t.len() > 600);
        let mut bad = std::collections::BTreeSet::new();
        for a in t {
            for b in t {
                if (a.symbol == b.symbol) != (a.addr == b.addr) {
                    bad.insert((a.symbol.min(b.symbol), a.symbol.max(b.symbol)));
                }
            }
        }
        assert!(bad.is_empty(), "{} pairs: {bad:?}", bad.len());
    }
}
