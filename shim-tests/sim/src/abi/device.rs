//! Device queries (cuDevice*).

use std::ffi::c_char;

use super::{cstr, cuda_fn, out, write_cstr};
use crate::device;
use crate::sim::cuda;
use crate::types::*;

cuda_fn! {
    fn cuDeviceGet(dev: *mut CUdevice, ordinal: i32) {
        let sim = cuda()?;
        if dev.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        sim.phys(ordinal)?;
        out(dev, ordinal)
    }

    fn cuDeviceGetCount(count: *mut i32) {
        out(count, cuda()?.visible.len() as i32)
    }

    fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        write_cstr(name, usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?, device::DEVICE_NAME)
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        out(uuid, CUuuid { bytes: sim.cfg.devices[p].uuid })
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        out(uuid, CUuuid { bytes: sim.cfg.devices[p].uuid })
    }

    fn cuDeviceGetAttribute(pi: *mut i32, attrib: i32, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        if pi.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pi, device::attribute(attrib, p, &sim.cfg.devices[p]).ok_or(CUDA_ERROR_INVALID_VALUE)?)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        out(bytes, sim.cfg.devices[p].memory as usize)
    }

    fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        out(bytes, sim.cfg.devices[p].memory.min(u32::MAX as u64) as u32)
    }

    fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: CUdevice) {
        cuda()?.phys(dev)?;
        out(major, 9)?;
        out(minor, 0)
    }

    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: i32, dev: CUdevice) {
        let sim = cuda()?;
        let p = sim.phys(dev)?;
        write_cstr(bus_id, usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?, &device::cuda_pci_bus_id(p))
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) {
        let sim = cuda()?;
        let want = cstr(bus_id)?.to_ascii_lowercase();
        let want = want.trim_start_matches("0000");
        let ordinal = sim
            .visible
            .iter()
            .position(|&p| device::cuda_pci_bus_id(p).trim_start_matches("0000") == want)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        out(dev, ordinal as i32)
    }

    fn cuDeviceCanAccessPeer(can: *mut i32, dev: CUdevice, peer: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        sim.phys(peer)?;
        out(can, (dev != peer) as i32)
    }

    fn cuDeviceGetLuid(luid: *mut c_char, mask: *mut u32, dev: CUdevice) {
        cuda()?.phys(dev)?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}
