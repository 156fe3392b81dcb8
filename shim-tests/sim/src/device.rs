//! Devices: which physical devices a process sees (CUDA_VISIBLE_DEVICES), their names, UUIDs, PCI ids and
//! attributes (modelled on an H100 SXM, compute capability 9.0, with the configured SM count and memory).
//!
//! CUDA ordinals are positions in the resolved visible list; NVML indexes all physical devices.

use crate::config::{format_uuid, mig_uuid, DeviceConfig};
use crate::types::*;

/// Resolves CUDA_VISIBLE_DEVICES the way the real driver does: a comma list of indices, `GPU-<uuid prefix>`
/// or `MIG-<uuid prefix>` entries; the first invalid (unknown, ambiguous or repeated) entry ends the list.
/// Unset = all devices. Returns physical indices in CUDA ordinal order.
pub(crate) fn resolve_visible(spec: Option<&str>, uuids: &[[u8; 16]]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    for entry in spec.split(',') {
        let e = entry.trim();
        let found = if let Some(prefix) = e.strip_prefix("GPU-") {
            match_prefix(prefix, uuids.iter().map(|u| format_uuid("GPU", u)), "GPU-")
        } else if let Some(prefix) = e.strip_prefix("MIG-") {
            match_prefix(
                prefix,
                uuids.iter().map(|u| format_uuid("MIG", &mig_uuid(u))),
                "MIG-",
            )
        } else if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            e.parse::<usize>().ok().filter(|i| *i < uuids.len())
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

fn match_prefix(prefix: &str, names: impl Iterator<Item = String>, tag: &str) -> Option<usize> {
    if prefix.is_empty() {
        return None;
    }
    let want = format!("{tag}{}", prefix.to_ascii_lowercase());
    let hits: Vec<usize> = names
        .enumerate()
        .filter(|(_, n)| n.starts_with(&want))
        .map(|(i, _)| i)
        .collect();
    match hits.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The marketing name every simulated device reports.
pub(crate) const DEVICE_NAME: &str = "NVIDIA H100 80GB HBM3 (cudasim)";
/// PCI device id (0x2330 = H100 SXM5) with NVIDIA's vendor id.
pub(crate) const PCI_DEVICE_ID: u32 = 0x2330_10de;
pub(crate) const PCI_SUBSYSTEM_ID: u32 = 0x16c1_10de;

/// PCI (domain, bus, device) of physical device `phys`.
pub(crate) fn pci_ids(phys: usize) -> (u32, u32, u32) {
    (0, 0x18 + 0x10 * phys as u32, 0)
}

/// `0000:18:00.0` (what cuDeviceGetPCIBusId returns).
pub(crate) fn cuda_pci_bus_id(phys: usize) -> String {
    let (dom, bus, dev) = pci_ids(phys);
    format!("{dom:04x}:{bus:02x}:{dev:02x}.0")
}

/// `00000000:18:00.0` (NVML's busId).
pub(crate) fn nvml_pci_bus_id(phys: usize) -> String {
    let (dom, bus, dev) = pci_ids(phys);
    format!("{dom:08X}:{bus:02X}:{dev:02X}.0")
}

/// cuDeviceGetAttribute. `None` for a value outside CUdevice_attribute.
pub(crate) fn attribute(attr: i32, phys: usize, dev: &DeviceConfig) -> Option<i32> {
    let (domain, bus, device) = pci_ids(phys);
    Some(match attr {
        1 => 1024,                              // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                          // MAX_BLOCK_DIM_X/Y
        4 => 64,                                // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                          // MAX_GRID_DIM_X
        6 | 7 => 65535,                         // MAX_GRID_DIM_Y/Z
        8 => 48 * 1024,                         // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 64 * 1024,                         // TOTAL_CONSTANT_MEMORY
        10 => 32,                               // WARP_SIZE
        11 => i32::MAX,                         // MAX_PITCH
        12 => 65536,                            // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,                        // CLOCK_RATE (kHz)
        14 => 512,                              // TEXTURE_ALIGNMENT
        15 => 1,                                // GPU_OVERLAP
        16 => dev.sms as i32,                   // MULTIPROCESSOR_COUNT
        17 => 0,                                // KERNEL_EXEC_TIMEOUT
        18 => 0,                                // INTEGRATED
        19 => 1,                                // CAN_MAP_HOST_MEMORY
        20 => 0,                                // COMPUTE_MODE (default)
        21 => 131072,                           // MAXIMUM_TEXTURE1D_WIDTH
        22 => 131072,                           // MAXIMUM_TEXTURE2D_WIDTH
        23 => 65536,                            // MAXIMUM_TEXTURE2D_HEIGHT
        24..=26 => 16384,                       // MAXIMUM_TEXTURE3D_*
        27 | 28 => 32768,                       // TEXTURE2D_LAYERED_WIDTH/HEIGHT
        29 => 2048,                             // TEXTURE2D_LAYERED_LAYERS
        30 => 512,                              // SURFACE_ALIGNMENT
        31 => 1,                                // CONCURRENT_KERNELS
        32 => 1,                                // ECC_ENABLED
        33 => bus as i32,                       // PCI_BUS_ID
        34 => device as i32,                    // PCI_DEVICE_ID
        35 => 0,                                // TCC_DRIVER
        36 => 2_619_000,                        // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                             // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 * 1024 * 1024,                 // L2_CACHE_SIZE
        39 => 2048,                             // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 5,                                // ASYNC_ENGINE_COUNT
        41 => 1,                                // UNIFIED_ADDRESSING
        42 => 32768,                            // TEXTURE1D_LAYERED_WIDTH
        43 => 2048,                             // TEXTURE1D_LAYERED_LAYERS
        44 => 1,                                // CAN_TEX2D_GATHER
        45 | 46 => 32768,                       // TEXTURE2D_GATHER_*
        47 | 48 => 8192,                        // TEXTURE3D_*_ALTERNATE
        49 => 32768,                            // TEXTURE3D_DEPTH_ALTERNATE
        50 => domain as i32,                    // PCI_DOMAIN_ID
        51 => 32,                               // TEXTURE_PITCH_ALIGNMENT
        52 | 53 => 32768,                       // TEXTURECUBEMAP_*
        54 => 2046,                             // TEXTURECUBEMAP_LAYERED_LAYERS
        55..=60 => 32768,                       // SURFACE*
        61 => 32768,                            // SURFACE1D_LAYERED_WIDTH
        62 => 2048,                             // SURFACE1D_LAYERED_LAYERS
        63 | 64 => 32768,                       // SURFACE2D_LAYERED_WIDTH/HEIGHT
        65 => 2048,                             // SURFACE2D_LAYERED_LAYERS
        66 | 67 => 32768,                       // SURFACECUBEMAP_*
        68 => 2046,                             // SURFACECUBEMAP_LAYERED_LAYERS
        69 => 268_435_456,                      // TEXTURE1D_LINEAR_WIDTH
        70 | 71 => 131072,                      // TEXTURE2D_LINEAR_WIDTH/HEIGHT
        72 => 2_097_120,                        // TEXTURE2D_LINEAR_PITCH
        73 | 74 => 32768,                       // TEXTURE2D_MIPMAPPED_*
        75 => 9,                                // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                                // COMPUTE_CAPABILITY_MINOR
        77 => 32768,                            // TEXTURE1D_MIPMAPPED_WIDTH
        78..=80 => 1,                           // STREAM_PRIORITIES / GLOBAL_L1 / LOCAL_L1
        81 => 228 * 1024,                       // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                            // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                                // MANAGED_MEMORY
        84 => 0,                                // MULTI_GPU_BOARD
        85 => phys as i32,                      // MULTI_GPU_BOARD_GROUP_ID
        86 => 0,                                // HOST_NATIVE_ATOMIC_SUPPORTED
        87 => 2,                                // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        88 => 0,                                // PAGEABLE_MEMORY_ACCESS
        89 => 1,                                // CONCURRENT_MANAGED_ACCESS
        90 => 1,                                // COMPUTE_PREEMPTION_SUPPORTED
        91 => 0,                                // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        92..=94 => 0,                           // stream mem ops v1
        95 | 96 => 1,                           // COOPERATIVE_LAUNCH / _MULTI_DEVICE
        97 => 227 * 1024,                       // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        98 => 0,                                // CAN_FLUSH_REMOTE_WRITES
        99 => 1,                                // HOST_REGISTER_SUPPORTED
        100 | 101 => 0,          // pageable access via host page tables / direct managed access
        102 => 1,                // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,                // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        104 | 105 => 0,          // win32 handles
        106 => 32,               // MAX_BLOCKS_PER_MULTIPROCESSOR
        107 => 1,                // GENERIC_COMPRESSION_SUPPORTED
        108 => 30 * 1024 * 1024, // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 * 1024 * 1024, // MAX_ACCESS_POLICY_WINDOW_SIZE
        110 => 1,                // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
        111 => 1024,             // RESERVED_SHARED_MEMORY_PER_BLOCK
        112..=114 => 1,          // sparse arrays / read-only host register / timeline semaphores
        115 => 1,                // MEMORY_POOLS_SUPPORTED
        116 => 1,                // GPU_DIRECT_RDMA_SUPPORTED
        117 | 118 => 0,          // RDMA flush / ordering
        119 => 1,                // MEMPOOL_SUPPORTED_HANDLE_TYPES (posix fd)
        120 => 1,                // CLUSTER_LAUNCH
        121 => 1,                // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
        122 | 123 => 1,          // stream mem ops
        124 => 1,                // DMA_BUF_SUPPORTED
        125 => 1,                // IPC_EVENT_SUPPORTED
        126 => 4,                // MEM_SYNC_DOMAIN_COUNT
        127 => 1,                // TENSOR_MAP_ACCESS_SUPPORTED
        128 => 0,                // HANDLE_TYPE_FABRIC_SUPPORTED
        129 => 0,                // UNIFIED_FUNCTION_POINTERS
        130 => 0,                // NUMA_CONFIG
        131 => -1,               // NUMA_ID
        132 => 0,                // MULTICAST_SUPPORTED
        133 => 0,                // MPS_ENABLED
        134 => -1,               // HOST_NUMA_ID
        135..=138 => 0,          // D3D12 CIG / decompress / Vulkan CIG
        139 => (PCI_DEVICE_ID >> 16) as i32, // GPU_PCI_DEVICE_ID
        140 => (PCI_SUBSYSTEM_ID >> 16) as i32, // GPU_PCI_SUBSYSTEM_ID
        141..=147 => 0,          // host NUMA / host pools / host VMM / dma-buf / partial atomics
        a if (0..CU_DEVICE_ATTRIBUTE_MAX).contains(&a) => 0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::derived_uuid;

    fn uuids(n: usize) -> Vec<[u8; 16]> {
        (0..n).map(|i| derived_uuid(i, 0)).collect()
    }

    #[test]
    fn visible_indices() {
        let u = uuids(4);
        assert_eq!(resolve_visible(None, &u), vec![0, 1, 2, 3]);
        assert_eq!(resolve_visible(Some("2,0"), &u), vec![2, 0]);
        assert_eq!(resolve_visible(Some(" 3 , 1"), &u), vec![3, 1]);
        assert_eq!(resolve_visible(Some(""), &u), Vec::<usize>::new());
        // The first invalid entry ends the list.
        assert_eq!(resolve_visible(Some("1,7,0"), &u), vec![1]);
        assert_eq!(resolve_visible(Some("1,x,0"), &u), vec![1]);
        assert_eq!(resolve_visible(Some("1,1,0"), &u), vec![1]);
        assert_eq!(resolve_visible(Some("-1,0"), &u), Vec::<usize>::new());
    }

    #[test]
    fn visible_uuids() {
        let mut u = uuids(3);
        u[1] = crate::config::parse_uuid("GPU-abcd0000-0000-4000-8000-000000000001").unwrap();
        u[2] = crate::config::parse_uuid("GPU-abcd0000-0000-4000-8000-000000000002").unwrap();
        let full = format_uuid("GPU", &u[2]);
        assert_eq!(resolve_visible(Some(&full), &u), vec![2]);
        assert_eq!(resolve_visible(Some(&full.to_uppercase()), &u), vec![2]);
        // Unique prefix works, ambiguous prefix ends the list.
        assert_eq!(
            resolve_visible(Some("0,GPU-abcd0000-0000-4000-8000-0000000000"), &u),
            vec![0]
        );
        assert_eq!(
            resolve_visible(Some("GPU-abcd0000-0000-4000-8000-000000000001,0"), &u),
            vec![1, 0]
        );
        let mig = format_uuid("MIG", &mig_uuid(&u[0]));
        assert_eq!(resolve_visible(Some(&format!("{mig},2")), &u), vec![0, 2]);
        assert_eq!(resolve_visible(Some("GPU-"), &u), Vec::<usize>::new());
    }

    #[test]
    fn attributes() {
        let d = DeviceConfig {
            memory: 1 << 30,
            sms: 7,
            uuid: [0; 16],
        };
        assert_eq!(
            attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0, &d),
            Some(7)
        );
        assert_eq!(attribute(75, 0, &d), Some(9));
        assert_eq!(attribute(76, 0, &d), Some(0));
        assert_eq!(attribute(10, 0, &d), Some(32));
        assert_eq!(attribute(33, 1, &d), Some(0x28));
        assert_eq!(attribute(0, 0, &d), Some(0));
        assert_eq!(attribute(CU_DEVICE_ATTRIBUTE_MAX, 0, &d), None);
        assert_eq!(attribute(-1, 0, &d), None);
    }
}
