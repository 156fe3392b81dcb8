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
}

impl Gpu {
    /// A GPU from its UUID (any form [`parse_uuid`] reads), memory and model.
    pub fn new(uuid: &str, memory: u64, model: &str) -> Result<Gpu, String> {
        let bytes = parse_uuid(uuid).ok_or_else(|| format!("{uuid:?} is not a GPU UUID (GPU-xxxxxxxx-…)"))?;
        let uuid = format_uuid(&bytes);
        Ok(Gpu {
            name: uuid.to_lowercase(),
            uuid,
            memory,
            model: model.to_string(),
        })
    }

    /// Parses `--gpu UUID=MEMORY[=MODEL]` (memory a Kubernetes quantity: `80Gi`).
    pub fn parse_arg(s: &str) -> Result<Gpu, String> {
        let mut it = s.splitn(3, '=');
        let uuid = it.next().unwrap_or_default();
        let mem = it.next().ok_or("expected UUID=MEMORY[=MODEL], e.g. GPU-…=80Gi")?;
        let memory = crate::quantity::parse(mem)
            .filter(|m| *m > 0)
            .ok_or_else(|| format!("memory {mem:?} is not a positive quantity (80Gi)"))?;
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
