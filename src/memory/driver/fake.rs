//! The one fake driver of memory's unit tests. Queries: it knows what a test told it (pools' reserved and used
//! sizes, the device and size of allocations), refuses every other question, and counts the questions it was
//! asked. Elastic memory's moves: address ranges, handles with their bytes, mappings, each call counted by
//! name, and the calls a test told to fail. NVML: the process list a test set.

use super::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// What the fake refuses with: a code no family makes up itself, so a test that sees it saw the driver's.
pub(crate) const REFUSED: CUresult = CUresult::ERROR_UNKNOWN;

#[derive(Default)]
pub(crate) struct Fake {
    /// Each pool's reserved size (absent: refused).
    pub(crate) reserved: RefCell<HashMap<usize, u64>>,
    /// Every pool's used size.
    pub(crate) used: Cell<u64>,
    /// Each allocation's device and size (absent: refused).
    pub(crate) allocations: RefCell<HashMap<u64, (c_int, usize)>>,
    /// Each device's default and current pool (absent: refused).
    pub(crate) device_pools: RefCell<HashMap<CUdevice, (usize, usize)>>,
    /// Addresses where the driver knows no allocation (`range_start` says `CUDA_ERROR_INVALID_VALUE`; an
    /// address in `allocations` starts there; any other is refused).
    pub(crate) unknown: RefCell<std::collections::HashSet<u64>>,
    /// Questions asked.
    pub(crate) asked: Cell<u32>,
    vmm: RefCell<Vmm>,
    /// NVML's process list on every device: (pid, used bytes); `None`: NVML cannot tell.
    listed: RefCell<Option<Vec<(u32, u64)>>>,
}

/// What the VMM calls made and unmade.
#[derive(Default)]
struct Vmm {
    next_va: u64,
    next_h: u64,
    /// Live handles: their bytes and whether they are host memory.
    handles: HashMap<u64, (Vec<u8>, bool)>,
    /// Mappings: address -> handle.
    maps: HashMap<u64, u64>,
    reserved: HashMap<u64, u64>,
    /// Calls by name, and the (name, nth) calls that fail.
    calls: HashMap<&'static str, u32>,
    fail: Vec<(&'static str, u32)>,
    busy: bool,
    /// Device memory refused with out of memory (host memory still made).
    full: bool,
    /// Devices (0..n) that can access each other as peers (0: one device, the count refused).
    devices: c_int,
    /// A grant naming more than one device refused.
    refuse_peers: bool,
    /// Each mapped address's devices granted by the last `set_access`.
    access: HashMap<u64, Vec<CUdevice>>,
}

impl Fake {
    /// Pool `pool` reserves `bytes` (named apart from `Driver::reserve`, an address range).
    pub(crate) fn reserve_pool(&self, pool: usize, bytes: u64) {
        self.reserved.borrow_mut().insert(pool, bytes);
    }

    fn ask(&self) {
        self.asked.set(self.asked.get() + 1);
    }

    /// Counts a VMM call; `Err` when a test told it to fail.
    fn step(&self, name: &'static str) -> Result<(), CUresult> {
        let mut s = self.vmm.borrow_mut();
        let n = s.calls.entry(name).or_insert(0);
        *n += 1;
        let n = *n;
        if s.fail.contains(&(name, n)) {
            Err(REFUSED)
        } else {
            Ok(())
        }
    }

    /// The `nth_from_now` call named `name` fails.
    pub(crate) fn fail(&self, name: &'static str, nth_from_now: u32) {
        let mut s = self.vmm.borrow_mut();
        let n = s.calls.get(name).copied().unwrap_or(0) + nth_from_now;
        s.fail.push((name, n));
    }

    /// Whether the program's streams still run.
    pub(crate) fn set_busy(&self, busy: bool) {
        self.vmm.borrow_mut().busy = busy;
    }

    /// `n` devices, each a peer of the others; `refuse`: a grant to more than one device is refused.
    pub(crate) fn set_peers(&self, n: c_int, refuse: bool) {
        let mut s = self.vmm.borrow_mut();
        s.devices = n;
        s.refuse_peers = refuse;
    }

    /// The devices the last grant at `p` named.
    pub(crate) fn access_at(&self, p: u64) -> Vec<CUdevice> {
        self.vmm.borrow().access.get(&p).cloned().unwrap_or_default()
    }

    pub(crate) fn set_full(&self, full: bool) {
        self.vmm.borrow_mut().full = full;
    }

    pub(crate) fn bytes_at(&self, p: u64) -> Vec<u8> {
        let s = self.vmm.borrow();
        s.handles[&s.maps[&p]].0.clone()
    }

    pub(crate) fn write(&self, p: u64, v: &[u8]) {
        let mut s = self.vmm.borrow_mut();
        let h = s.maps[&p];
        s.handles.get_mut(&h).unwrap().0.copy_from_slice(v);
    }

    pub(crate) fn on_host(&self, p: u64) -> bool {
        let s = self.vmm.borrow();
        s.handles[&s.maps[&p]].1
    }

    /// NVML lists these (pid, used bytes) on every device from now on (`None`: it cannot tell).
    pub(crate) fn list(&self, listed: Option<&[(u32, u64)]>) {
        *self.listed.borrow_mut() = listed.map(<[_]>::to_vec);
    }

    /// Handles, mappings and reservations alive.
    pub(crate) fn live(&self) -> (usize, usize, usize) {
        let s = self.vmm.borrow();
        (s.handles.len(), s.maps.len(), s.reserved.len())
    }
}

impl Driver for Fake {
    fn pool_attribute(&self, pool: usize, attr: CUmemPool_attribute) -> Result<u64, CUresult> {
        self.ask();
        let r = *self.reserved.borrow().get(&pool).ok_or(REFUSED)?;
        Ok(if attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT {
            self.used.get()
        } else {
            r
        })
    }
    fn pointer_device(&self, p: u64) -> Result<c_int, CUresult> {
        self.ask();
        self.allocations.borrow().get(&p).map(|a| a.0).ok_or(REFUSED)
    }
    fn address_size(&self, p: u64) -> Result<usize, CUresult> {
        self.ask();
        self.allocations.borrow().get(&p).map(|a| a.1).ok_or(REFUSED)
    }
    fn range_start(&self, p: u64) -> Result<u64, CUresult> {
        self.ask();
        if self.unknown.borrow().contains(&p) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        self.allocations.borrow().get(&p).map(|_| p).ok_or(REFUSED)
    }
    fn mem_pool(&self, ordinal: CUdevice) -> Result<usize, CUresult> {
        self.device_pools
            .borrow()
            .get(&ordinal)
            .map(|p| p.1)
            .ok_or(REFUSED)
    }
    fn default_mem_pool(&self, ordinal: CUdevice) -> Result<usize, CUresult> {
        self.device_pools
            .borrow()
            .get(&ordinal)
            .map(|p| p.0)
            .ok_or(REFUSED)
    }
    fn device_attribute(&self, _: CUdevice_attribute, _: CUdevice) -> Result<c_int, CUresult> {
        Err(REFUSED)
    }
    fn function_local_size(&self, _: CUfunction) -> Result<c_int, CUresult> {
        Err(REFUSED)
    }
    fn kernel_local_size(&self, _: CUfunction, _: CUdevice) -> Result<c_int, CUresult> {
        Err(REFUSED)
    }
    fn stack_size(&self) -> Result<usize, CUresult> {
        Err(REFUSED)
    }
    fn device_count(&self) -> Result<c_int, CUresult> {
        match self.vmm.borrow().devices {
            0 => Err(REFUSED),
            n => Ok(n),
        }
    }
    fn can_access_peer(&self, dev: CUdevice, peer: CUdevice) -> Result<bool, CUresult> {
        let n = self.vmm.borrow().devices;
        if !(0..n).contains(&dev) || !(0..n).contains(&peer) {
            return Err(REFUSED);
        }
        Ok(dev != peer)
    }
    fn graph_nodes(&self, _: CUgraph) -> Result<Vec<CUgraphNode>, CUresult> {
        Err(REFUSED)
    }
    fn node_type(&self, _: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
        Err(REFUSED)
    }
    fn child_graph(&self, _: CUgraphNode) -> Result<CUgraph, CUresult> {
        Err(REFUSED)
    }
    fn alloc_node(&self, _: CUgraphNode) -> Result<(Option<CUdevice>, u64), CUresult> {
        Err(REFUSED)
    }
    fn kernel_node(&self, _: CUgraphNode) -> Result<(CUfunction, CUkernel), CUresult> {
        Err(REFUSED)
    }
    fn graph_mem_attribute(&self, _: CUdevice, _: CUgraphMem_attribute) -> Result<u64, CUresult> {
        Err(REFUSED)
    }

    fn current_context(&self) -> Result<CUcontext, CUresult> {
        Ok(0x100 as CUcontext)
    }
    fn in_context(&self, _: CUcontext, f: &mut dyn FnMut()) -> Result<(), CUresult> {
        f();
        Ok(())
    }
    fn reserve(&self, size: u64) -> Result<CUdeviceptr, CUresult> {
        self.step("reserve")?;
        let mut s = self.vmm.borrow_mut();
        s.next_va += 1 << 40;
        let p = s.next_va;
        s.reserved.insert(p, size);
        Ok(p)
    }
    fn address_free(&self, ptr: CUdeviceptr, _: u64) -> Result<(), CUresult> {
        self.step("address_free")?;
        self.vmm
            .borrow_mut()
            .reserved
            .remove(&ptr)
            .map(|_| ())
            .ok_or(REFUSED)
    }
    fn create(&self, size: u64, on: Option<CUdevice>) -> Result<u64, CUresult> {
        self.step("create")?;
        let mut s = self.vmm.borrow_mut();
        if s.full && on.is_some() {
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
        s.next_h += 1;
        let h = s.next_h;
        s.handles.insert(h, (vec![0; size as usize], on.is_none()));
        Ok(h)
    }
    fn release(&self, h: u64) -> Result<(), CUresult> {
        self.step("release")?;
        let mut s = self.vmm.borrow_mut();
        assert!(!s.maps.values().any(|&m| m == h), "a mapped handle released");
        s.handles.remove(&h).map(|_| ()).ok_or(REFUSED)
    }
    fn map(&self, ptr: CUdeviceptr, _: u64, h: u64) -> Result<(), CUresult> {
        self.step("map")?;
        let mut s = self.vmm.borrow_mut();
        assert!(s.reserved.contains_key(&ptr) && s.handles.contains_key(&h));
        assert!(s.maps.insert(ptr, h).is_none(), "mapped twice");
        Ok(())
    }
    fn unmap(&self, ptr: CUdeviceptr, _: u64) -> Result<(), CUresult> {
        self.step("unmap")?;
        self.vmm.borrow_mut().maps.remove(&ptr).map(|_| ()).ok_or(REFUSED)
    }
    fn set_access(&self, ptr: CUdeviceptr, _: u64, devices: &[CUdevice]) -> Result<(), CUresult> {
        self.step("set_access")?;
        let mut s = self.vmm.borrow_mut();
        if s.refuse_peers && devices.len() > 1 {
            return Err(REFUSED);
        }
        assert!(s.maps.contains_key(&ptr), "access to an unmapped range");
        s.access.insert(ptr, devices.to_vec());
        Ok(())
    }
    fn stream_create(&self) -> Result<CUstream, CUresult> {
        Ok(0x5000 as CUstream)
    }
    fn copy(&self, dst: CUdeviceptr, src: CUdeviceptr, n: u64, _: CUstream) -> Result<(), CUresult> {
        self.step("copy")?;
        let v = self.bytes_at(src);
        assert_eq!(v.len() as u64, n);
        self.write(dst, &v);
        Ok(())
    }
    fn stream_idle(&self, _: CUstream) -> Result<bool, CUresult> {
        Ok(!self.vmm.borrow().busy)
    }
    fn synchronize(&self) -> Result<(), CUresult> {
        Ok(())
    }
}

impl Processes for Fake {
    fn processes(&self, _uuid: &[u8; 16]) -> Option<Vec<nvmlProcessInfo_v2_t>> {
        let l = self.listed.borrow();
        let procs = l.as_ref()?.iter().map(|&(pid, used)| nvmlProcessInfo_v2_t {
            pid,
            usedGpuMemory: used,
            ..Default::default()
        });
        Some(procs.collect())
    }
}
