//! The `cuGetProcAddress` reverse map: {real address of each function we export → our export of the same
//! name}, built once from the driver table. A pointer the driver hands out that we hook becomes ours; anything
//! else passes through unchanged. No name parsing, no version tables to drift.

/// Sorted `(real address, our address)` pairs.
pub(crate) struct ProcMap {
    pairs: Vec<(usize, usize)>,
}

impl ProcMap {
    /// Builds the map from `(name, real address)` pairs, keeping only names we export. `ours` gives our export's
    /// address for a name. When two names share a real address, the first one wins.
    pub(crate) fn build<'a>(
        resolved: impl IntoIterator<Item = (&'a str, usize)>,
        ours: impl Fn(&[u8]) -> Option<usize>,
    ) -> Self {
        let mut pairs: Vec<(usize, usize)> = resolved
            .into_iter()
            .filter_map(|(name, real)| ours(name.as_bytes()).map(|o| (real, o)))
            .collect();
        pairs.sort_by_key(|p| p.0);
        pairs.dedup_by_key(|p| p.0);
        ProcMap { pairs }
    }

    /// Our replacement for a real function pointer, if we hook it.
    pub(crate) fn lookup(&self, real: usize) -> Option<usize> {
        self.pairs
            .binary_search_by_key(&real, |p| p.0)
            .ok()
            .map(|i| self.pairs[i].1)
    }

    /// Number of mapped functions.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pairs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::ProcMap;

    #[test]
    fn reverse_map_maps_only_exported_names() {
        let ours = |n: &[u8]| match n {
            b"cuMemAlloc_v2" => Some(0x1000),
            b"cuMemFree_v2" => Some(0x2000),
            _ => None,
        };
        let m = ProcMap::build(
            [
                ("cuMemAlloc_v2", 0xa0),
                ("cuCtxGetDevice", 0xb0),
                ("cuMemFree_v2", 0x90),
            ],
            ours,
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.lookup(0xa0), Some(0x1000));
        assert_eq!(m.lookup(0x90), Some(0x2000));
        assert_eq!(m.lookup(0xb0), None);
        assert_eq!(m.lookup(0), None);
    }
}
