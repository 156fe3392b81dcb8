//! `CUDA_VISIBLE_DEVICES`: which physical devices a program sees, and in what order (= CUDA ordinals).
//!
//! The shim maps CUDA ordinals to devices by asking the driver (`cuDeviceGetUuid`); this module is for
//! processes that only use NVML (nvidia-smi, monitoring agents), where NVML enumerates *all* physical devices
//! and we need the CUDA ordinal a device would have, to apply the per-ordinal limits.
//!
//! Semantics follow the CUDA driver: entries are separated by commas; each is a decimal index, a `GPU-` UUID
//! prefix or a `MIG-` UUID; the first invalid entry ends the list (devices after it are not visible); an empty
//! value hides every device; unset shows all devices in index order.

/// One entry of `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleEntry {
    /// A physical device index (NVML order).
    Index(u32),
    /// A GPU UUID or a prefix of it, stored lower-case with its `GPU-` prefix.
    Gpu(String),
    /// A MIG instance UUID, stored lower-case with its `MIG-` prefix.
    Mig(String),
}

/// Parsed `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleDevices {
    /// Valid entries, in order; position = CUDA ordinal.
    pub entries: Vec<VisibleEntry>,
    /// True if parsing stopped at an invalid entry (the driver ignores it and everything after it).
    pub truncated: bool,
}

impl VisibleDevices {
    /// Parses the variable's value. Never fails: like the driver, stops at the first invalid entry.
    pub fn parse(value: &str) -> VisibleDevices {
        let mut entries = Vec::new();
        let mut truncated = false;
        if value.trim().is_empty() {
            return VisibleDevices { entries, truncated };
        }
        for raw in value.split(',') {
            let item = raw.trim();
            let lower = item.to_ascii_lowercase();
            let entry = if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) {
                item.parse::<u32>().ok().map(VisibleEntry::Index)
            } else if lower.starts_with("gpu-") && lower.len() > 4 {
                Some(VisibleEntry::Gpu(lower))
            } else if lower.starts_with("mig-") && lower.len() > 4 {
                Some(VisibleEntry::Mig(lower))
            } else {
                None
            };
            match entry {
                Some(e) if !entries.contains(&e) => entries.push(e),
                _ => {
                    truncated = true;
                    break;
                }
            }
        }
        VisibleDevices { entries, truncated }
    }

    /// CUDA ordinal of the NVML device with physical index `nvml_index` and UUID `uuid` (`GPU-…`), or `None`
    /// when the device is not visible. `mig_uuids` are the UUIDs of that GPU's MIG instances (pass `&[]` if
    /// unknown); a `MIG-` entry matches the device when it names one of them, or when `uuid` itself is that
    /// MIG UUID (an NVML MIG device handle).
    pub fn ordinal_of(&self, nvml_index: u32, uuid: &str, mig_uuids: &[&str]) -> Option<u32> {
        let uuid = uuid.to_ascii_lowercase();
        self.entries
            .iter()
            .position(|e| match e {
                VisibleEntry::Index(i) => *i == nvml_index,
                VisibleEntry::Gpu(prefix) => uuid.starts_with(prefix.as_str()),
                VisibleEntry::Mig(m) => *m == uuid || mig_uuids.iter().any(|x| x.eq_ignore_ascii_case(m)),
            })
            .and_then(|p| u32::try_from(p).ok())
    }
}

/// CUDA ordinal of an NVML device given the (possibly unset) `CUDA_VISIBLE_DEVICES`: its position in the list,
/// or its NVML index when the variable is unset.
pub fn cuda_ordinal(
    visible: Option<&VisibleDevices>,
    nvml_index: u32,
    uuid: &str,
    mig_uuids: &[&str],
) -> Option<u32> {
    match visible {
        None => Some(nvml_index),
        Some(v) => v.ordinal_of(nvml_index, uuid, mig_uuids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-0f3a9c1e-1111-2222-3333-444455556666";
    const B: &str = "GPU-7b2d4e5f-aaaa-bbbb-cccc-ddddeeeeffff";

    #[test]
    fn indices_and_order() {
        let v = VisibleDevices::parse("2,0");
        assert_eq!(v.entries, vec![VisibleEntry::Index(2), VisibleEntry::Index(0)]);
        assert_eq!(v.ordinal_of(2, A, &[]), Some(0));
        assert_eq!(v.ordinal_of(0, B, &[]), Some(1));
        assert_eq!(v.ordinal_of(1, B, &[]), None);
    }

    #[test]
    fn uuid_prefixes_any_case() {
        let v = VisibleDevices::parse("gpu-7B2D, GPU-0f3a9c1e-1111-2222-3333-444455556666");
        assert_eq!(v.ordinal_of(0, A, &[]), Some(1));
        assert_eq!(v.ordinal_of(1, B, &[]), Some(0));
    }

    #[test]
    fn invalid_entry_truncates() {
        let v = VisibleDevices::parse("1,foo,0");
        assert!(v.truncated);
        assert_eq!(v.entries, vec![VisibleEntry::Index(1)]);
        assert_eq!(v.ordinal_of(0, A, &[]), None);
        let v = VisibleDevices::parse("-1");
        assert!(v.entries.is_empty());
        // duplicates are invalid too
        let v = VisibleDevices::parse("0,0,1");
        assert_eq!(v.entries, vec![VisibleEntry::Index(0)]);
    }

    #[test]
    fn empty_hides_all_unset_shows_all() {
        let v = VisibleDevices::parse("");
        assert_eq!(v.ordinal_of(0, A, &[]), None);
        assert_eq!(cuda_ordinal(None, 3, A, &[]), Some(3));
        assert_eq!(cuda_ordinal(Some(&v), 3, A, &[]), None);
    }

    #[test]
    fn mig_entries() {
        let mig = "MIG-11112222-3333-4444-5555-666677778888";
        let v = VisibleDevices::parse(&mig.to_lowercase());
        assert_eq!(v.ordinal_of(0, A, &[mig]), Some(0));
        assert_eq!(v.ordinal_of(0, mig, &[]), Some(0));
        assert_eq!(v.ordinal_of(1, B, &[]), None);
    }
}
