//! The node's GPUs as the driver publishes them: one device per GPU, named after its UUID.

use cuquota_core::region::layout::{format_uuid, parse_uuid};

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// `GPU-…`, as NVML and `CUDA_VISIBLE_DEVICES` write it.
    pub uuid: String,
    /// The device's name in the ResourceSlice: the UUID in lower case (`gpu-…`, a DNS label).
    pub name: String,
    /// Device memory in bytes.
    pub memory: u64,
    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// What NVML says of it beside the name (empty for a GPU named with `--gpu`).
    pub details: Details,
}

/// A GPU's attributes from NVML and sysfs, published under NVIDIA's DRA driver's names (and upstream's
/// `resource.kubernetes.io/` ones); each `None` where the node cannot say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    /// `Hopper`.
    pub architecture: Option<String>,
    /// A semantic version: `9.0.0`.
    pub compute_capability: Option<String>,
    /// A semantic version: `580.82.7` (NVML's `580.82.07` without the leading zero semver forbids).
    pub driver_version: Option<String>,
    /// The kernel's name of the PCI function: `0000:18:00.0`.
    pub pci_bus_id: Option<String>,
    /// The PCIe root complex the GPU hangs from (sysfs): `pci0000:17`.
    pub pcie_root: Option<String>,
}

/// `version` as a semantic version `MAJOR.MINOR.PATCH` (missing parts 0, leading zeros dropped), or `None`
/// when it is not one to three dot-separated numbers.
pub fn semver(version: &str) -> Option<String> {
    let parts: Vec<u64> = version
        .trim()
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let part = |i: usize| parts.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", part(0), part(1), part(2)))
}

/// The PCIe root of the PCI function `bus_id` (`0000:18:00.0`), as upstream's `deviceattribute` helper finds
/// it: the `pciDDDD:BB` component of the function's sysfs path, `HOST_ROOT/sys/bus/pci/devices/<bus_id>`.
pub fn pcie_root(host_root: &std::path::Path, bus_id: &str) -> Option<String> {
    let link = host_root.join("sys/bus/pci/devices").join(bus_id);
    let real = std::fs::canonicalize(link).ok()?;
    real.components().find_map(|c| {
        let c = c.as_os_str().to_str()?;
        let rest = c.strip_prefix("pci")?;
        let (dom, bus) = rest.split_once(':')?;
        let hex = |s: &str, n| s.len() == n && s.chars().all(|ch| ch.is_ascii_hexdigit());
        (hex(dom, 4) && hex(bus, 2)).then(|| c.to_string())
    })
}

/// A GPU that cannot be published as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// Not a GPU UUID.
    #[error("{0:?} is not a GPU UUID (GPU-xxxxxxxx-…)")]
    Uuid(String),
    /// `--gpu` without `=MEMORY`.
    #[error("expected UUID=MEMORY[=MODEL], e.g. GPU-…=80Gi")]
    Form,
    /// `--gpu`'s memory is no positive quantity.
    #[error("memory {0:?} is not a positive quantity (80Gi)")]
    Memory(String),
}

impl Gpu {
    /// A GPU from its UUID (any form [`parse_uuid`] reads), memory and model.
    pub fn new(uuid: &str, memory: u64, model: &str) -> Result<Gpu, GpuError> {
        let bytes = parse_uuid(uuid).ok_or_else(|| GpuError::Uuid(uuid.to_string()))?;
        let uuid = format_uuid(&bytes);
        Ok(Gpu {
            name: uuid.to_lowercase(),
            uuid,
            memory,
            model: model.to_string(),
            details: Details::default(),
        })
    }

    /// Parses `--gpu UUID=MEMORY[=MODEL]` (memory a Kubernetes quantity: `80Gi`).
    pub fn parse_arg(s: &str) -> Result<Gpu, GpuError> {
        let mut it = s.splitn(3, '=');
        let uuid = it.next().unwrap_or_default();
        let mem = it.next().ok_or(GpuError::Form)?;
        let memory = crate::quantity::parse(mem)
            .filter(|m| *m > 0)
            .ok_or_else(|| GpuError::Memory(mem.to_string()))?;
        Gpu::new(uuid, memory, it.next().unwrap_or("NVIDIA GPU"))
    }
}

/// The GPUs of this node, and the pool (the node's name) they are published in.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// The pool: the node name.
    pub pool: String,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
}

impl Inventory {
    /// The GPU published as `name`.
    pub fn by_name(&self, name: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.name == name)
    }

    /// The device names.
    pub fn names(&self) -> Vec<&str> {
        self.gpus.iter().map(|g| g.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_semantic() {
        assert_eq!(semver("580.82.07").as_deref(), Some("580.82.7"));
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("9").as_deref(), Some("9.0.0"));
        assert_eq!(semver("1.2.3.4"), None);
        assert_eq!(semver("580.x"), None);
        assert_eq!(semver(""), None);
    }

    #[test]
    fn pcie_root_from_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let dev = root
            .path()
            .join("sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        let devices = root.path().join("sys/bus/pci/devices");
        std::fs::create_dir_all(&devices).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0",
            devices.join("0000:18:00.0"),
        )
        .unwrap();
        assert_eq!(
            pcie_root(root.path(), "0000:18:00.0").as_deref(),
            Some("pci0000:17")
        );
        assert_eq!(pcie_root(root.path(), "0000:28:00.0"), None);
    }
}
