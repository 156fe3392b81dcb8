//! Memory: allocation (plain, pitched, managed, host, pools, VMM, arrays), copies, sets, queries.

use std::ffi::c_void;

use super::{alias, cuda_fn, h, hp, out, read};
use crate::array;
use crate::context;
use crate::memory::{self, AllocKind};
use crate::objects::{with, Objects};
use crate::pool;
use crate::sim::{cuda, Sim};
use crate::stream;
use crate::timeline::sleep_until;
use crate::touch;
use crate::types::*;
use crate::vmm;

fn alloc(dptr: *mut u64, bytes: u64, kind: AllocKind, low: bool) -> CuResult<u64> {
    let sim = cuda()?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    with(|o| {
        let c = context::current(o, sim)?;
        memory::alloc(o, sim, c, bytes, kind, low)
    })
}

fn free(p: u64) -> CuResult<()> {
    let sim = cuda()?;
    if p == 0 {
        return Ok(());
    }
    touch::wait_all();
    with(|o| memory::free(o, sim, p))
}

/// Which sides of a copy must be device memory.
#[derive(Clone, Copy)]
enum Dir {
    HtoD,
    DtoH,
    DtoD,
    /// Unified addressing: device-ness decided per pointer.
    Any,
}

/// Whether (dst, src) must be device memory.
fn sides(o: &Objects, dst: u64, src: u64, dir: Dir) -> (bool, bool) {
    match dir {
        Dir::HtoD => (true, false),
        Dir::DtoH => (false, true),
        Dir::DtoD => (true, true),
        Dir::Any => (memory::is_device_memory(o, dst), memory::is_device_memory(o, src)),
    }
}

fn validate_copy(o: &Objects, dst: u64, src: u64, len: u64, dir: Dir) -> CuResult<()> {
    let (d, s) = sides(o, dst, src, dir);
    if (d || s) && len > 0 && (dst == 0 || src == 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if d {
        memory::check_device_range(o, dst, len)?;
    }
    if s {
        memory::check_device_range(o, src, len)?;
    }
    Ok(())
}

/// Device time of moving `bytes` (a copy or a memset) at the configured bandwidth (`CUDASIM_COPY_GBPS`).
fn copy_ns(sim: &Sim, bytes: u64) -> u64 {
    // 1 MB/s moves a byte in 1000 ns.
    (bytes as u128 * 1000)
        .div_ceil(sim.cfg.copy_mbps.max(1) as u128)
        .min(u64::MAX as u128) as u64
}

/// Whether `p` is device-resident memory (an allocation, or a VMM mapping of device memory), for the copy
/// engines: anything else is the host's.
fn resident(o: &Objects, p: u64) -> bool {
    o.mem.find(p).is_some() || (o.vmm.mapping_at(p).is_some() && !o.vmm.host_backed(p))
}

/// The copy engine of a copy to `dst` from `src` (0: host to device, 1: device to host), when the simulator has
/// one for that direction (`CUDASIM_H2D_GBPS`, `CUDASIM_D2H_GBPS`), and the copy's time on it.
fn engine(o: &Objects, sim: &Sim, dst: u64, src: u64, bytes: u64) -> Option<(usize, u64)> {
    let mbps = sim.cfg.engine_mbps;
    if mbps == [0, 0] {
        return None;
    }
    let e = match (resident(o, dst), resident(o, src)) {
        (true, false) => 0,
        (false, true) => 1,
        _ => return None,
    };
    let ns = (bytes as u128 * 1000)
        .div_ceil(mbps[e].max(1) as u128)
        .min(u64::MAX as u128) as u64;
    (mbps[e] > 0).then_some((e, ns))
}

/// A copy or memset of `bytes` on stream handle `s` (0: the legacy NULL stream): `check` validates it with the
/// stream resolved (`Ok(false)`: captured into a graph, nothing runs now); then its time is queued on the
/// stream's device timeline like a kernel's, or on a copy engine (`ends`: a copy's (dst, src)), sleeping while
/// the stream's queue is full, and `work` moves the bytes — or, while work of `touch` kernels is pending in
/// the process, `later` gives what moves them at the copy's end on the timeline, so they stay in order with the
/// kernels. `sync`: the synchronous forms, which return when the stream's work, this included, is done.
fn on_stream(
    sim: &Sim,
    s: u64,
    bytes: u64,
    sync: bool,
    mut check: impl FnMut(&mut Objects, u64) -> CuResult<bool>,
    (ends, later): (Option<(u64, u64)>, impl Fn(&Objects) -> Vec<touch::Work>),
    work: impl FnOnce(),
) -> CuResult<()> {
    let mut work = Some(work);
    loop {
        let next = with(|o| -> CuResult<Result<Option<(u64, u64)>, u64>> {
            let st = stream::resolve(o, sim, s)?;
            if !check(o, st)? {
                return Ok(Ok(None));
            }
            let ctx = o.streams[&st].ctx;
            let mut deferred = false;
            if bytes > 0 {
                let (_, phys) = context::device_of(o, ctx)?;
                let wait = match ends.and_then(|(d, s)| engine(o, sim, d, s, bytes)) {
                    Some((e, ns)) => stream::enqueue_copy(o, sim, st, phys, e, ns)?,
                    None => stream::enqueue(o, sim, st, phys, &[copy_ns(sim, bytes)])?,
                };
                if let Some(t) = wait {
                    return Ok(Err(t)); // the stream's queue is full
                }
                if !o.pending.is_empty() {
                    let x = &o.streams[&st];
                    let at = if x.held.is_empty() {
                        x.tail
                    } else {
                        crate::timeline::now_ns()
                    };
                    for w in later(o) {
                        touch::defer(o, ctx, at, w);
                    }
                    work = None;
                    deferred = true;
                }
            }
            if let Some(w) = work.take() {
                w();
            }
            Ok(Ok(sync.then(|| {
                (stream::done_time(o, st), if deferred { ctx } else { 0 })
            })))
        })?;
        match next {
            Ok(done) => {
                if let Some((t, ctx)) = done {
                    sleep_until(t);
                    if ctx != 0 {
                        touch::after_wait();
                        with(|o| context::check_fault(o, ctx))?;
                    }
                }
                return Ok(());
            }
            Err(t) => sleep_until(t),
        }
    }
}

/// A copy as pending work: pageable host source bytes are staged now, as the driver stages them.
fn copy_work(o: &Objects, dst: u64, src: u64, len: u64, dir: Dir) -> touch::Work {
    let (dst_device, src_device) = sides(o, dst, src, dir);
    let staged = (!src_device && o.mem.find_host(src).is_none() && len > 0).then(|| {
        // SAFETY: the program's host memory, which the copy reads now, as a driver stages pageable memory.
        unsafe { std::slice::from_raw_parts(src as *const u8, len as usize) }.to_vec()
    });
    touch::Work::Copy {
        dst,
        src,
        len,
        dst_device,
        src_device,
        staged,
    }
}

/// A synchronous copy: on the legacy stream, after its work; returns when it is done.
fn copy_sync(dst: u64, src: u64, len: u64, dir: Dir) -> CuResult<()> {
    let sim = cuda()?;
    on_stream(
        sim,
        0,
        len,
        true,
        |o, _| validate_copy(o, dst, src, len, dir).map(|_| true),
        (Some((dst, src)), |o| vec![copy_work(o, dst, src, len, dir)]),
        || memory::copy(dst, src, len),
    )
}

/// An asynchronous copy on `s`: queued on the stream's device timeline (the bytes move now, or at the copy's
/// end while `touch` kernels' work is pending: see `on_stream`), or, while `s` is capturing, run when the
/// captured graph runs.
fn copy_async(dst: u64, src: u64, len: u64, dir: Dir, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    on_stream(
        sim,
        h(s),
        len,
        false,
        |o, st| {
            validate_copy(o, dst, src, len, dir)?;
            if o.streams.get(&st).is_some_and(|x| x.capture.is_some()) {
                let (dst_device, src_device) = sides(o, dst, src, dir);
                let node = crate::graph::CopyNode {
                    dst,
                    src,
                    len,
                    dst_device,
                    src_device,
                };
                crate::graph::capture(o, st, crate::graph::NodeKind::Memcpy(node))?;
                return Ok(false);
            }
            Ok(true)
        },
        (Some((dst, src)), |o| vec![copy_work(o, dst, src, len, dir)]),
        || memory::copy(dst, src, len),
    )
}

/// Runs the copies of a graph being launched (device ranges checked again: they may have been freed).
pub(crate) fn run_graph_copies(copies: &[crate::graph::CopyNode]) -> CuResult<()> {
    with(|o| {
        for c in copies {
            if c.dst_device {
                memory::check_device_range(o, c.dst, c.len)?;
            }
            if c.src_device {
                memory::check_device_range(o, c.src, c.len)?;
            }
        }
        for c in copies {
            memory::copy(c.dst, c.src, c.len);
        }
        Ok(())
    })
}

/// A memset of `count` elements of `width` bytes: on `s` (`None`: synchronous, on the legacy stream).
fn set(dst: u64, value: u32, width: u64, count: u64, s: Option<Handle>) -> CuResult<()> {
    let sim = cuda()?;
    let bytes = width * count;
    on_stream(
        sim,
        s.map_or(0, h),
        bytes,
        s.is_none(),
        |o, _| {
            if !dst.is_multiple_of(width) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            memory::check_device_range(o, dst, bytes)?;
            Ok(true)
        },
        (None, |_| {
            vec![touch::Work::Fill {
                dst,
                value,
                width,
                count,
            }]
        }),
        || memory::fill(dst, value, width, count),
    )
}

/// 2D set: `height` rows of `width` elements, `pitch` bytes apart.
fn set_2d(
    dst: u64,
    pitch: u64,
    value: u32,
    esize: u64,
    width: u64,
    height: u64,
    s: Option<Handle>,
) -> CuResult<()> {
    if height > 0 && pitch < width * esize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for row in 0..height {
        set(dst + row * pitch, value, esize, width, s)?;
    }
    Ok(())
}

fn copy_2d(p: &Memcpy2D, s: Option<Handle>) -> CuResult<()> {
    let sim = cuda()?;
    if p.src_memory_type == CU_MEMORYTYPE_ARRAY || p.dst_memory_type == CU_MEMORYTYPE_ARRAY {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let addr = |ty: u32, host: u64, dev: u64| if ty == CU_MEMORYTYPE_HOST { host } else { dev };
    let src = addr(p.src_memory_type, p.src_host as u64, p.src_device);
    let dst = addr(p.dst_memory_type, p.dst_host as u64, p.dst_device);
    let src_pitch = if p.src_pitch == 0 {
        p.width_in_bytes
    } else {
        p.src_pitch
    } as u64;
    let dst_pitch = if p.dst_pitch == 0 {
        p.width_in_bytes
    } else {
        p.dst_pitch
    } as u64;
    if p.height > 1 && (src_pitch < p.width_in_bytes as u64 || dst_pitch < p.width_in_bytes as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (width, height) = (p.width_in_bytes as u64, p.height as u64);
    let rows = move || {
        (0..height).map(move |row| {
            let so = src + (p.src_y as u64 + row) * src_pitch + p.src_x_in_bytes as u64;
            let d = dst + (p.dst_y as u64 + row) * dst_pitch + p.dst_x_in_bytes as u64;
            (d, so)
        })
    };
    on_stream(
        sim,
        s.map_or(0, h),
        width * height,
        s.is_none(),
        |o, _| {
            for (d, so) in rows() {
                validate_copy(o, d, so, width, Dir::Any)?;
            }
            Ok(true)
        },
        (Some((dst, src)), |o| {
            rows()
                .map(|(d, so)| copy_work(o, d, so, width, Dir::Any))
                .collect()
        }),
        || {
            for (d, so) in rows() {
                memory::copy(d, so, width);
            }
        },
    )
}

fn mem_get_info() -> CuResult<(u64, u64)> {
    let sim = cuda()?;
    let phys = with(|o| -> CuResult<usize> {
        let c = context::current(o, sim)?;
        Ok(context::device_of(o, c)?.1)
    })?;
    Ok(sim.mem_info(phys))
}

fn address_range(base: *mut u64, size: *mut usize, p: u64) -> CuResult<()> {
    let sim = cuda()?;
    let (b, s) = with(|o| -> CuResult<(u64, u64)> {
        context::current(o, sim)?;
        if let Some((b, a)) = o.mem.find(p) {
            return Ok((b, a.size));
        }
        if let Some((b, m)) = o.vmm.mapping_at(p) {
            return Ok((b, m.size));
        }
        Err(CUDA_ERROR_NOT_FOUND)
    })?;
    // SAFETY: both out-pointers are optional per the API.
    unsafe {
        if !base.is_null() {
            *base = b;
        }
        if !size.is_null() {
            *size = s as usize;
        }
    }
    Ok(())
}

fn pitch_alloc(width: u64, height: u64, elem: u32) -> CuResult<(u64, u64)> {
    if !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = width.div_ceil(512) * 512;
    Ok((pitch, pitch.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?))
}

fn host_alloc(pp: *mut *mut c_void, bytes: u64) -> CuResult<()> {
    cuda()?;
    if pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = with(|o| memory::host_alloc(o, bytes))?;
    // SAFETY: checked non-NULL.
    unsafe { out(pp, p as *mut c_void) }
}

fn pool_alloc(dptr: *mut u64, bytes: u64, pool: Option<u64>, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = with(|o| -> CuResult<u64> {
        let st = stream::resolve(o, sim, h(s))?;
        let ctx = o.streams[&st].ctx;
        if o.streams[&st].capture.is_some() {
            // Captured: becomes an alloc node of the capture graph (memory at graph launch).
            let ordinal = match pool {
                Some(p) => o.pools.get(&p).ok_or(CUDA_ERROR_INVALID_VALUE)?.ordinal,
                None => context::device_of(o, ctx)?.0,
            };
            let ptr = crate::graph_mem::node_alloc(o, sim, ordinal, bytes, ctx)?;
            // SAFETY: all-zero is a valid CUmemPoolProps (plain integers and a NULL pointer).
            let mut props: MemPoolProps = unsafe { std::mem::zeroed() };
            props.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location = MemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            };
            // SAFETY: plain data of the same size.
            let props = unsafe { std::mem::transmute::<MemPoolProps, [u8; 88]>(props) };
            let kind = crate::graph::NodeKind::MemAlloc { ptr, bytes, props };
            if let Err(e) = crate::graph::capture(o, st, kind) {
                crate::graph_mem::release_va(o, ptr);
                return Err(e);
            }
            return Ok(ptr);
        }
        let pool = match pool {
            Some(p) => p,
            None => {
                let (ordinal, _) = context::device_of(o, ctx)?;
                pool::current_pool(o, sim, ordinal)?
            }
        };
        pool::alloc(o, sim, pool, bytes, ctx)
    })?;
    // SAFETY: checked non-NULL.
    unsafe { out(dptr, p) }
}

fn free_async(p: u64, s: Handle) -> CuResult<()> {
    let sim = cuda()?;
    with(|o| {
        let st = stream::resolve(o, sim, h(s))?;
        let graph_ptr = o
            .mem
            .allocs
            .get(&p)
            .is_some_and(|a| a.kind == memory::AllocKind::Graph);
        if graph_ptr && o.streams[&st].capture.is_some() {
            return crate::graph::capture(o, st, crate::graph::NodeKind::MemFree(p));
        }
        memory::free(o, sim, p)
    })
}

/// The binding key of a multicast range: the memory's device and the offset in the object.
fn multicast_key(ordinal: usize, mc_offset: u64) -> Vec<u8> {
    let mut k = (ordinal as u64).to_le_bytes().to_vec();
    k.extend_from_slice(&mc_offset.to_le_bytes());
    k
}

/// Binds `size` bytes of physical allocation `mem` at `mc_offset` of multicast object `mc`.
fn multicast_bind(o: &mut Objects, sim: &Sim, mc: u64, mc_offset: u64, mem: u64, size: u64) -> CuResult<()> {
    let mc_size = vmm::multicast_size(o, mc)?;
    if size == 0 || mc_offset.saturating_add(size) > mc_size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ordinal = vmm::ordinal_of(o, mem)?;
    vmm::bind(o, sim, (mc, multicast_key(ordinal, mc_offset)), mem)
}

fn array3d_create(parray: *mut Handle, d: Array3DDescriptor) -> CuResult<()> {
    let sim = cuda()?;
    if parray.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let a = with(|o| array::create(o, sim, d))?;
    // SAFETY: checked non-NULL.
    unsafe { out(parray, hp(a)) }
}

fn array_desc(a: Handle) -> CuResult<Array3DDescriptor> {
    cuda()?;
    with(|o| {
        o.arrays
            .get(&h(a))
            .map(|a| a.desc)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

fn to_2d(d: ArrayDescriptor) -> Array3DDescriptor {
    Array3DDescriptor {
        width: d.width,
        height: d.height,
        depth: 0,
        format: d.format,
        num_channels: d.num_channels,
        flags: 0,
    }
}

/// Writes one pointer attribute for `p` into `data`.
///
/// # Safety
/// `data` must be valid for the attribute's type (the cuPointerGetAttribute contract).
unsafe fn pointer_attribute(
    o: &Objects,
    data: *mut c_void,
    attr: u32,
    p: u64,
    lenient: bool,
) -> CuResult<()> {
    enum Found {
        Dev(u64, memory::Alloc),
        Host(u64, u64),
        Vmm(u64, vmm::Mapping, usize),
    }
    let found = if let Some((b, a)) = o.mem.find(p) {
        Some(Found::Dev(b, a.clone()))
    } else if let Some((b, l)) = o.mem.find_host(p) {
        Some(Found::Host(b, l))
    } else {
        o.vmm.mapping_at(p).map(|(b, m)| {
            let ordinal = o.vmm.handles.get(&m.handle).map_or(0, |a| a.ordinal);
            Found::Vmm(b, m, ordinal)
        })
    };
    let Some(found) = found else {
        if lenient {
            // cuPointerGetAttributes on unknown memory: zeroes (memory type 0 = unregistered host).
            // SAFETY: every attribute's type is at least 4 bytes; pointer-sized ones are zeroed fully below.
            unsafe {
                match attr {
                    CU_POINTER_ATTRIBUTE_MEMORY_TYPE
                    | CU_POINTER_ATTRIBUTE_IS_MANAGED
                    | CU_POINTER_ATTRIBUTE_MAPPED => *(data as *mut u32) = 0,
                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => *(data as *mut i32) = -2,
                    _ => *(data as *mut u64) = 0,
                }
            }
            return Ok(());
        }
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    // SAFETY: writes of the attribute's documented type into the caller's buffer.
    unsafe {
        match (attr, &found) {
            (CU_POINTER_ATTRIBUTE_CONTEXT, Found::Dev(_, a)) => *(data as *mut u64) = a.ctx,
            (CU_POINTER_ATTRIBUTE_CONTEXT, _) => *(data as *mut u64) = 0,
            (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, Found::Host(..)) => *(data as *mut u32) = CU_MEMORYTYPE_HOST,
            (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, _) => *(data as *mut u32) = CU_MEMORYTYPE_DEVICE,
            (CU_POINTER_ATTRIBUTE_DEVICE_POINTER, _) => *(data as *mut u64) = p,
            (CU_POINTER_ATTRIBUTE_HOST_POINTER, Found::Host(..)) => *(data as *mut u64) = p,
            (CU_POINTER_ATTRIBUTE_HOST_POINTER, Found::Dev(_, a)) if a.kind == AllocKind::Managed => {
                *(data as *mut u64) = p
            }
            (CU_POINTER_ATTRIBUTE_HOST_POINTER, _) => return Err(CUDA_ERROR_INVALID_VALUE),
            (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, _) => *(data as *mut u32) = 1,
            (CU_POINTER_ATTRIBUTE_BUFFER_ID, Found::Dev(_, a)) => *(data as *mut u64) = a.buffer_id,
            (CU_POINTER_ATTRIBUTE_BUFFER_ID, _) => *(data as *mut u64) = p,
            (CU_POINTER_ATTRIBUTE_IS_MANAGED, Found::Dev(_, a)) => {
                *(data as *mut u32) = (a.kind == AllocKind::Managed) as u32
            }
            (CU_POINTER_ATTRIBUTE_IS_MANAGED, _) => *(data as *mut u32) = 0,
            (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Found::Dev(_, a)) => *(data as *mut i32) = a.ordinal as i32,
            (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Found::Vmm(_, _, d)) => *(data as *mut i32) = *d as i32,
            (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, Found::Host(..)) => *(data as *mut i32) = -1,
            (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, Found::Dev(b, _))
            | (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, Found::Host(b, _))
            | (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, Found::Vmm(b, _, _)) => *(data as *mut u64) = *b,
            (CU_POINTER_ATTRIBUTE_RANGE_SIZE, Found::Dev(_, a)) => *(data as *mut usize) = a.size as usize,
            (CU_POINTER_ATTRIBUTE_RANGE_SIZE, Found::Host(_, l)) => *(data as *mut usize) = *l as usize,
            (CU_POINTER_ATTRIBUTE_RANGE_SIZE, Found::Vmm(_, m, _)) => *(data as *mut usize) = m.size as usize,
            (CU_POINTER_ATTRIBUTE_MAPPED, _) => *(data as *mut u32) = 1,
            (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, Found::Dev(_, a)) => {
                *(data as *mut u64) = if let AllocKind::Pool(pl) = a.kind { pl } else { 0 }
            }
            (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, _) => *(data as *mut u64) = 0,
            (a, _) if a <= 21 => *(data as *mut u64) = 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

cuda_fn! {
    fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) {
        let p = alloc(dptr, bytesize as u64, AllocKind::Device, false)?;
        out(dptr, p)
    }

    fn cuMemAlloc(dptr: *mut u32, bytesize: u32) {
        let p = alloc(dptr as *mut u64, bytesize as u64, AllocKind::Device, true)?;
        out(dptr, p as u32)
    }

    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32) {
        if pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (pi, bytes) = pitch_alloc(width as u64, height as u64, elem)?;
        let p = alloc(dptr, bytes, AllocKind::Device, false)?;
        out(pitch, pi as usize)?;
        out(dptr, p)
    }

    fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) {
        if pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (pi, bytes) = pitch_alloc(width as u64, height as u64, elem)?;
        let p = alloc(dptr as *mut u64, bytes, AllocKind::Device, true)?;
        out(pitch, pi as u32)?;
        out(dptr, p as u32)
    }

    fn cuMemFree_v2(dptr: u64) {
        free(dptr)
    }

    fn cuMemFree(dptr: u32) {
        free(dptr as u64)
    }

    fn cuMemAllocManaged(dptr: *mut u64, bytesize: usize, flags: u32) {
        if flags != 1 && flags != 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = alloc(dptr, bytesize as u64, AllocKind::Managed, false)?;
        out(dptr, p)
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        host_alloc(pp, bytesize as u64)
    }

    fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: u32) {
        host_alloc(pp, bytesize as u64)
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: u32) {
        if flags & !0x7 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        host_alloc(pp, bytesize as u64)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        cuda()?;
        touch::wait_all();
        with(|o| memory::host_free(o, p as u64))
    }

    fn cuMemHostGetDevicePointer_v2(pdptr: *mut u64, p: *mut c_void, flags: u32) {
        cuda()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| o.mem.find_host(p as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(pdptr, p as u64)
    }

    fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) {
        cuda()?;
        with(|o| o.mem.find_host(p as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, 0)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = mem_get_info()?;
        out(free, f as usize)?;
        out(total, t as usize)
    }

    fn cuMemGetInfo(free: *mut u32, total: *mut u32) {
        if free.is_null() || total.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (f, t) = mem_get_info()?;
        out(free, f.min(u32::MAX as u64) as u32)?;
        out(total, t.min(u32::MAX as u64) as u32)
    }

    fn cuMemGetAddressRange_v2(pbase: *mut u64, psize: *mut usize, dptr: u64) {
        address_range(pbase, psize, dptr)
    }

    fn cuMemGetAddressRange(pbase: *mut u32, psize: *mut u32, dptr: u32) {
        let (mut b, mut s) = (0u64, 0usize);
        address_range(&mut b, &mut s, dptr as u64)?;
        if !pbase.is_null() {
            out(pbase, b as u32)?;
        }
        if !psize.is_null() {
            out(psize, s as u32)?;
        }
        Ok(())
    }

    // ---- copies ----

    fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) {
        copy_sync(dst, src as u64, n as u64, Dir::HtoD)
    }

    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) {
        copy_sync(dst as u64, src, n as u64, Dir::DtoH)
    }

    fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) {
        copy_sync(dst, src, n as u64, Dir::DtoD)
    }

    fn cuMemcpyHtoD(dst: u32, src: *const c_void, n: u32) {
        copy_sync(dst as u64, src as u64, n as u64, Dir::HtoD)
    }

    fn cuMemcpyDtoH(dst: *mut c_void, src: u32, n: u32) {
        copy_sync(dst as u64, src as u64, n as u64, Dir::DtoH)
    }

    fn cuMemcpyDtoD(dst: u32, src: u32, n: u32) {
        copy_sync(dst as u64, src as u64, n as u64, Dir::DtoD)
    }

    fn cuMemcpy(dst: u64, src: u64, n: usize) {
        copy_sync(dst, src, n as u64, Dir::Any)
    }

    fn cuMemcpyPeer(dst: u64, dst_ctx: Handle, src: u64, src_ctx: Handle, n: usize) {
        copy_sync(dst, src, n as u64, Dir::DtoD)
    }

    fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: Handle) {
        copy_async(dst, src as u64, n as u64, Dir::HtoD, s)
    }

    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: Handle) {
        copy_async(dst as u64, src, n as u64, Dir::DtoH, s)
    }

    fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: Handle) {
        copy_async(dst, src, n as u64, Dir::DtoD, s)
    }

    fn cuMemcpyHtoDAsync(dst: u32, src: *const c_void, n: u32, s: Handle) {
        copy_async(dst as u64, src as u64, n as u64, Dir::HtoD, s)
    }

    fn cuMemcpyDtoHAsync(dst: *mut c_void, src: u32, n: u32, s: Handle) {
        copy_async(dst as u64, src as u64, n as u64, Dir::DtoH, s)
    }

    fn cuMemcpyDtoDAsync(dst: u32, src: u32, n: u32, s: Handle) {
        copy_async(dst as u64, src as u64, n as u64, Dir::DtoD, s)
    }

    fn cuMemcpyAsync(dst: u64, src: u64, n: usize, s: Handle) {
        copy_async(dst, src, n as u64, Dir::Any, s)
    }

    fn cuMemcpyPeerAsync(dst: u64, dst_ctx: Handle, src: u64, src_ctx: Handle, n: usize, s: Handle) {
        copy_async(dst, src, n as u64, Dir::DtoD, s)
    }

    fn cuMemcpy2D_v2(p: *const Memcpy2D) {
        copy_2d(&read(p)?, None)
    }

    fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) {
        copy_2d(&read(p)?, None)
    }

    fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, s: Handle) {
        copy_2d(&read(p)?, Some(s))
    }

    // ---- sets ----

    fn cuMemsetD8_v2(dst: u64, v: u8, n: usize) {
        set(dst, v as u32, 1, n as u64, None)
    }

    fn cuMemsetD16_v2(dst: u64, v: u16, n: usize) {
        set(dst, v as u32, 2, n as u64, None)
    }

    fn cuMemsetD32_v2(dst: u64, v: u32, n: usize) {
        set(dst, v, 4, n as u64, None)
    }

    fn cuMemsetD8(dst: u32, v: u8, n: u32) {
        set(dst as u64, v as u32, 1, n as u64, None)
    }

    fn cuMemsetD16(dst: u32, v: u16, n: u32) {
        set(dst as u64, v as u32, 2, n as u64, None)
    }

    fn cuMemsetD32(dst: u32, v: u32, n: u32) {
        set(dst as u64, v, 4, n as u64, None)
    }

    fn cuMemsetD8Async(dst: u64, v: u8, n: usize, s: Handle) {
        set(dst, v as u32, 1, n as u64, Some(s))
    }

    fn cuMemsetD16Async(dst: u64, v: u16, n: usize, s: Handle) {
        set(dst, v as u32, 2, n as u64, Some(s))
    }

    fn cuMemsetD32Async(dst: u64, v: u32, n: usize, s: Handle) {
        set(dst, v, 4, n as u64, Some(s))
    }

    fn cuMemsetD2D8_v2(dst: u64, pitch: usize, v: u8, w: usize, hgt: usize) {
        set_2d(dst, pitch as u64, v as u32, 1, w as u64, hgt as u64, None)
    }

    fn cuMemsetD2D16_v2(dst: u64, pitch: usize, v: u16, w: usize, hgt: usize) {
        set_2d(dst, pitch as u64, v as u32, 2, w as u64, hgt as u64, None)
    }

    fn cuMemsetD2D32_v2(dst: u64, pitch: usize, v: u32, w: usize, hgt: usize) {
        set_2d(dst, pitch as u64, v, 4, w as u64, hgt as u64, None)
    }

    fn cuMemsetD2D8Async(dst: u64, pitch: usize, v: u8, w: usize, hgt: usize, s: Handle) {
        set_2d(dst, pitch as u64, v as u32, 1, w as u64, hgt as u64, Some(s))
    }

    fn cuMemsetD2D16Async(dst: u64, pitch: usize, v: u16, w: usize, hgt: usize, s: Handle) {
        set_2d(dst, pitch as u64, v as u32, 2, w as u64, hgt as u64, Some(s))
    }

    fn cuMemsetD2D32Async(dst: u64, pitch: usize, v: u32, w: usize, hgt: usize, s: Handle) {
        set_2d(dst, pitch as u64, v, 4, w as u64, hgt as u64, Some(s))
    }

    // ---- pools ----

    fn cuMemAllocAsync(dptr: *mut u64, bytesize: usize, s: Handle) {
        pool_alloc(dptr, bytesize as u64, None, s)
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut u64, bytesize: usize, pool: Handle, s: Handle) {
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        pool_alloc(dptr, bytesize as u64, Some(h(pool)), s)
    }

    fn cuMemFreeAsync(dptr: u64, s: Handle) {
        free_async(dptr, s)
    }

    fn cuMemPoolCreate(pool: *mut Handle, props: *const MemPoolProps) {
        let sim = cuda()?;
        let pr = read(props)?;
        if pool.is_null() || pr.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if pr.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let d = usize::try_from(pr.location.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        let p = with(|o| pool::create(o, sim, d, pr.handle_types))?;
        out(pool, hp(p))
    }

    fn cuMemPoolExportToShareableHandle(handle_out: *mut c_void, pool: Handle, handle_type: u32, flags: u64) {
        cuda()?;
        if handle_out.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let fd = with(|o| pool::export(o, h(pool), handle_type))?;
        out(handle_out as *mut i32, fd)
    }

    fn cuMemPoolImportFromShareableHandle(pool_out: *mut Handle, handle: *mut c_void, handle_type: u32, flags: u64) {
        let sim = cuda()?;
        if pool_out.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = with(|o| pool::import(o, sim, handle as usize as i32, handle_type))?;
        out(pool_out, hp(p))
    }

    fn cuMemPoolExportPointer(share_data: *mut [u8; 64], ptr: u64) {
        let sim = cuda()?;
        if share_data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let b = with(|o| pool::export_pointer(o, sim, ptr))?;
        out(share_data, b)
    }

    fn cuMemPoolImportPointer(ptr_out: *mut u64, pool: Handle, share_data: *mut [u8; 64]) {
        let sim = cuda()?;
        let data = read(share_data)?;
        if ptr_out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = with(|o| pool::import_pointer(o, sim, h(pool), &data))?;
        out(ptr_out, p)
    }

    fn cuMemPoolDestroy(pool: Handle) {
        let sim = cuda()?;
        with(|o| pool::destroy(o, sim, h(pool)))
    }

    fn cuMemPoolTrimTo(pool: Handle, keep: usize) {
        let sim = cuda()?;
        with(|o| pool::trim(o, sim, h(pool), keep as u64))
    }

    fn cuMemPoolGetAttribute(pool: Handle, attr: u32, value: *mut c_void) {
        cuda()?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            let p = o.pools.get(&h(pool)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attr {
                1..=3 => *(value as *mut i32) = p.reuse[attr as usize - 1],
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => *(value as *mut u64) = p.release_threshold,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => *(value as *mut u64) = p.reserved(),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => *(value as *mut u64) = p.reserved_high,
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => *(value as *mut u64) = p.used(),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => *(value as *mut u64) = p.used_high,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }

    fn cuMemPoolSetAttribute(pool: Handle, attr: u32, value: *mut c_void) {
        cuda()?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            let p = o.pools.get_mut(&h(pool)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attr {
                1..=3 => p.reuse[attr as usize - 1] = *(value as *const i32),
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = *(value as *const u64),
                // The high-water marks can only be reset to zero (= the current value).
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if *(value as *const u64) == 0 => p.reserved_high = p.reserved(),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH if *(value as *const u64) == 0 => p.used_high = p.used(),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }

    fn cuMemPoolSetAccess(pool: Handle, map: *const MemAccessDesc, count: usize) {
        cuda()?;
        with(|o| o.pools.contains_key(&h(pool))).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuMemPoolGetAccess(flags: *mut u32, pool: Handle, location: *mut MemLocation) {
        cuda()?;
        with(|o| o.pools.contains_key(&h(pool))).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, 3)
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pool, hp(with(|o| pool::default_pool(o, sim, dev as usize))?))
    }

    fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        if pool.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pool, hp(with(|o| pool::current_pool(o, sim, dev as usize))?))
    }

    fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) {
        let sim = cuda()?;
        sim.phys(dev)?;
        with(|o| pool::set_current_pool(o, sim, dev as usize, h(pool)))
    }

    // ---- virtual memory management ----

    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const MemAllocationProp, option: u32) {
        let sim = cuda()?;
        let p = read(prop)?;
        if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            sim.phys(p.location.id)?;
        }
        out(granularity, sim.cfg.granularity as usize)
    }

    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
        let sim = cuda()?;
        let p = read(prop)?;
        if handle.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(handle, with(|o| vmm::create(o, sim, size as u64, &p))?)
    }

    fn cuMemMapArrayAsync(list: *mut ArrayMapInfo, count: u32, s: Handle) {
        let sim = cuda()?;
        if list.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            stream::resolve(o, sim, h(s))?;
            for i in 0..count as usize {
                let m = std::ptr::read(list.add(i));
                let backed = |flags: u32| flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0;
                let sparse = match m.resource_type {
                    CU_RESOURCE_TYPE_ARRAY => o.arrays.get(&m.resource).is_some_and(|a| backed(a.desc.flags)),
                    CU_RESOURCE_TYPE_MIPMAPPED_ARRAY => {
                        o.mipmaps.get(&m.resource).is_some_and(|a| backed(a.desc.flags))
                    }
                    _ => false,
                };
                if !sparse || m.mem_handle_type != CU_MEM_HANDLE_TYPE_GENERIC {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let mut key = Vec::with_capacity(40);
                key.extend_from_slice(&m.subresource_type.to_le_bytes());
                for w in m.subresource {
                    key.extend_from_slice(&w.to_le_bytes());
                }
                key.extend_from_slice(&m.device_bit_mask.to_le_bytes());
                let key = (m.resource, key);
                match m.mem_operation_type {
                    CU_MEM_OPERATION_TYPE_MAP => crate::vmm::bind(o, sim, key, m.mem_handle)?,
                    CU_MEM_OPERATION_TYPE_UNMAP => {
                        crate::vmm::unbind_where(o, sim, |k| *k == key);
                    }
                    _ => return Err(CUDA_ERROR_INVALID_VALUE),
                }
            }
            Ok(())
        })
    }

    fn cuMulticastCreate(mc: *mut u64, prop: *const MulticastObjectProp) {
        let sim = cuda()?;
        let p = read(prop)?;
        if mc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(mc, with(|o| vmm::multicast_create(o, sim, p.size as u64, p.num_devices))?)
    }

    fn cuMulticastAddDevice(mc: u64, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        with(|o| vmm::multicast_size(o, mc)).map(|_| ())
    }

    fn cuMulticastGetGranularity(g: *mut usize, prop: *const MulticastObjectProp, option: u32) {
        let sim = cuda()?;
        read(prop)?;
        out(g, sim.cfg.granularity as usize)
    }

    fn cuMulticastBindMem(mc: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) {
        let sim = cuda()?;
        with(|o| multicast_bind(o, sim, mc, mc_offset as u64, mem, size as u64))
    }

    fn cuMulticastBindAddr(mc: u64, mc_offset: usize, memptr: u64, size: usize, flags: u64) {
        let sim = cuda()?;
        with(|o| -> CuResult<()> {
            let (mem, _) = vmm::handle_at(o, memptr)?;
            multicast_bind(o, sim, mc, mc_offset as u64, mem, size as u64)
        })
    }

    fn cuMulticastUnbind(mc: u64, dev: CUdevice, mc_offset: usize, size: usize) {
        let sim = cuda()?;
        sim.phys(dev)?;
        with(|o| -> CuResult<()> {
            vmm::multicast_size(o, mc)?;
            let n = vmm::unbind_where(o, sim, |k| k.0 == mc && k.1 == multicast_key(dev as usize, mc_offset as u64));
            if n == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok(())
        })
    }

    fn cuMemRelease(handle: u64) {
        let sim = cuda()?;
        with(|o| vmm::release(o, sim, handle))
    }

    fn cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64) {
        let sim = cuda()?;
        if ptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(ptr, with(|o| vmm::reserve(o, sim, size as u64, alignment as u64, addr))?)
    }

    fn cuMemAddressFree(ptr: u64, size: usize) {
        cuda()?;
        with(|o| vmm::address_free(o, ptr, size as u64))
    }

    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) {
        let sim = cuda()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| vmm::map(o, sim, ptr, size as u64, offset as u64, handle))
    }

    fn cuMemUnmap(ptr: u64, size: usize) {
        let sim = cuda()?;
        with(|o| vmm::unmap(o, sim, ptr, size as u64))
    }

    fn cuMemSetAccess(ptr: u64, size: usize, desc: *const MemAccessDesc, count: usize) {
        let sim = cuda()?;
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut grants = Vec::with_capacity(count);
        for i in 0..count {
            let d = read(desc.add(i))?;
            if d.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                sim.phys(d.location.id)?;
                grants.push((d.location.id as usize, d.flags));
            }
        }
        with(|o| vmm::set_access(o, ptr, size as u64, &grants))
    }

    fn cuMemGetAccess(flags: *mut u64, location: *const MemLocation, ptr: u64) {
        let sim = cuda()?;
        let l = read(location)?;
        let dev = if l.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            sim.phys(l.id)?;
            Some(l.id as usize)
        } else {
            None
        };
        let m = with(|o| o.vmm.mapping_at(ptr)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, if m.1.writable_by(dev) { 3 } else if m.1.readable_by(dev) { 1 } else { 0 })
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut MemAllocationProp, handle: u64) {
        cuda()?;
        if prop.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (ordinal, host) =
            with(|o| o.vmm.handles.get(&handle).map(|a| (a.ordinal, a.host))).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        std::ptr::write_bytes(prop, 0, 1);
        (*prop).type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
        let (type_, id) = host.unwrap_or((CU_MEM_LOCATION_TYPE_DEVICE, ordinal as i32));
        (*prop).location = MemLocation { type_, id };
        Ok(())
    }

    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: u64, handle_type: u32, flags: u64) {
        let sim = cuda()?;
        if shareable.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type == CU_MEM_HANDLE_TYPE_FABRIC {
            let b = with(|o| vmm::export_fabric(o, sim, handle))?;
            return out(shareable as *mut [u8; 64], b);
        }
        let fd = with(|o| vmm::export(o, sim, handle, handle_type))?;
        out(shareable as *mut i32, fd)
    }

    fn cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, handle_type: u32) {
        let sim = cuda()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = if handle_type == CU_MEM_HANDLE_TYPE_FABRIC {
            let b = read(os_handle as *const [u8; 64])?;
            with(|o| vmm::import_fabric(o, sim, &b))?
        } else {
            with(|o| vmm::import(o, sim, os_handle as usize as i32, handle_type))?
        };
        out(handle, h)
    }

    // ---- interprocess memory ----

    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: u64) {
        let sim = cuda()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let b = with(|o| crate::ipc::get_mem_handle(o, sim, dptr))?;
        out(handle, CUipcMemHandle { reserved: b })
    }

    fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: CUipcMemHandle, flags: u32) {
        let sim = cuda()?;
        if dptr.is_null() || flags & !CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = with(|o| crate::ipc::open_mem_handle(o, sim, &handle.reserved))?;
        out(dptr, p)
    }

    fn cuIpcGetEventHandle(handle: *mut CUipcMemHandle, event: *mut c_void) {
        cuda()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let b = with(|o| crate::ipc::get_event_handle(o, h(event)))?;
        out(handle, CUipcMemHandle { reserved: b })
    }

    fn cuIpcOpenEventHandle(event: *mut *mut c_void, handle: CUipcMemHandle) {
        let sim = cuda()?;
        if event.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let e = with(|o| crate::ipc::open_event_handle(o, sim, &handle.reserved))?;
        out(event, hp(e))
    }

    fn cuIpcCloseMemHandle(dptr: u64) {
        let sim = cuda()?;
        with(|o| crate::ipc::close_mem_handle(o, sim, dptr))
    }

    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        cuda()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = with(|o| vmm::retain(o, addr as u64))?;
        out(handle, h)
    }

    // ---- arrays ----

    fn cuArrayCreate_v2(parray: *mut Handle, desc: *const ArrayDescriptor) {
        array3d_create(parray, to_2d(read(desc)?))
    }

    fn cuArrayCreate(parray: *mut Handle, desc: *const ArrayDescriptorV1) {
        let d = read(desc)?;
        array3d_create(
            parray,
            to_2d(ArrayDescriptor {
                width: d.width as usize,
                height: d.height as usize,
                format: d.format,
                num_channels: d.num_channels,
            }),
        )
    }

    fn cuArray3DCreate_v2(parray: *mut Handle, desc: *const Array3DDescriptor) {
        array3d_create(parray, read(desc)?)
    }

    fn cuArray3DCreate(parray: *mut Handle, desc: *const Array3DDescriptorV1) {
        let d = read(desc)?;
        array3d_create(
            parray,
            Array3DDescriptor {
                width: d.width as usize,
                height: d.height as usize,
                depth: d.depth as usize,
                format: d.format,
                num_channels: d.num_channels,
                flags: d.flags,
            },
        )
    }

    fn cuArrayDestroy(a: Handle) {
        let sim = cuda()?;
        with(|o| array::destroy(o, sim, h(a)))
    }

    fn cuArrayGetDescriptor_v2(desc: *mut ArrayDescriptor, a: Handle) {
        let d = array_desc(a)?;
        if d.depth != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(desc, ArrayDescriptor { width: d.width, height: d.height, format: d.format, num_channels: d.num_channels })
    }

    fn cuArrayGetDescriptor(desc: *mut ArrayDescriptorV1, a: Handle) {
        let d = array_desc(a)?;
        out(
            desc,
            ArrayDescriptorV1 {
                width: d.width as u32,
                height: d.height as u32,
                format: d.format,
                num_channels: d.num_channels,
            },
        )
    }

    fn cuArray3DGetDescriptor_v2(desc: *mut Array3DDescriptor, a: Handle) {
        out(desc, array_desc(a)?)
    }

    fn cuArray3DGetDescriptor(desc: *mut Array3DDescriptorV1, a: Handle) {
        let d = array_desc(a)?;
        out(
            desc,
            Array3DDescriptorV1 {
                width: d.width as u32,
                height: d.height as u32,
                depth: d.depth as u32,
                format: d.format,
                num_channels: d.num_channels,
                flags: d.flags,
            },
        )
    }

    fn cuArrayGetMemoryRequirements(req: *mut ArrayMemoryRequirements, a: Handle, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        let bytes = with(|o| o.arrays.get(&h(a)).map(|a| (a.desc, a.level_of)))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
            .and_then(|(d, _)| array::array_bytes(&d, sim.cfg.granularity))?;
        out(req, ArrayMemoryRequirements { size: bytes as usize, alignment: sim.cfg.granularity as usize, reserved: [0; 4] })
    }

    fn cuMipmappedArrayCreate(pm: *mut Handle, desc: *const Array3DDescriptor, levels: u32) {
        let sim = cuda()?;
        let d = read(desc)?;
        if pm.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pm, hp(with(|o| array::mipmap_create(o, sim, d, levels))?))
    }

    fn cuMipmappedArrayDestroy(m: Handle) {
        let sim = cuda()?;
        with(|o| array::mipmap_destroy(o, sim, h(m)))
    }

    fn cuMipmappedArrayGetLevel(pa: *mut Handle, m: Handle, level: u32) {
        cuda()?;
        if pa.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pa, hp(with(|o| array::mipmap_level(o, h(m), level))?))
    }

    fn cuMipmappedArrayGetMemoryRequirements(req: *mut ArrayMemoryRequirements, m: Handle, dev: CUdevice) {
        let sim = cuda()?;
        sim.phys(dev)?;
        let bytes = with(|o| o.mipmaps.get(&h(m)).map(|m| m.bytes)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(req, ArrayMemoryRequirements { size: bytes as usize, alignment: sim.cfg.granularity as usize, reserved: [0; 4] })
    }

    // ---- pointer attributes ----

    fn cuPointerGetAttribute(data: *mut c_void, attr: u32, p: u64) {
        cuda()?;
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| pointer_attribute(o, data, attr, p, false))
    }

    fn cuPointerGetAttributes(n: u32, attrs: *const u32, data: *mut *mut c_void, p: u64) {
        cuda()?;
        if attrs.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|o| -> CuResult<()> {
            for i in 0..n as usize {
                let d = *data.add(i);
                if !d.is_null() {
                    let _ = pointer_attribute(o, d, *attrs.add(i), p, true);
                }
            }
            Ok(())
        })
    }
}

alias! {
    cuMemMapArrayAsync_ptsz => cuMemMapArrayAsync(list: *mut ArrayMapInfo, count: u32, s: Handle);
    cuIpcOpenMemHandle => cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: CUipcMemHandle, flags: u32);
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize);
    cuMemcpy_ptds => cuMemcpy(dst: u64, src: u64, n: usize);
    cuMemcpyPeer_ptds => cuMemcpyPeer(dst: u64, dst_ctx: Handle, src: u64, src_ctx: Handle, n: usize);
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: Handle);
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: Handle);
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: Handle);
    cuMemcpyAsync_ptsz => cuMemcpyAsync(dst: u64, src: u64, n: usize, s: Handle);
    cuMemcpyPeerAsync_ptsz => cuMemcpyPeerAsync(dst: u64, dst_ctx: Handle, src: u64, src_ctx: Handle, n: usize, s: Handle);
    cuMemcpy2D_v2_ptds => cuMemcpy2D_v2(p: *const Memcpy2D);
    cuMemcpy2DUnaligned_v2_ptds => cuMemcpy2DUnaligned_v2(p: *const Memcpy2D);
    cuMemcpy2DAsync_v2_ptsz => cuMemcpy2DAsync_v2(p: *const Memcpy2D, s: Handle);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: u64, v: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: u64, v: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: u64, v: u32, n: usize);
    cuMemsetD8Async_ptsz => cuMemsetD8Async(dst: u64, v: u8, n: usize, s: Handle);
    cuMemsetD16Async_ptsz => cuMemsetD16Async(dst: u64, v: u16, n: usize, s: Handle);
    cuMemsetD32Async_ptsz => cuMemsetD32Async(dst: u64, v: u32, n: usize, s: Handle);
    cuMemsetD2D8_v2_ptds => cuMemsetD2D8_v2(dst: u64, pitch: usize, v: u8, w: usize, hgt: usize);
    cuMemsetD2D16_v2_ptds => cuMemsetD2D16_v2(dst: u64, pitch: usize, v: u16, w: usize, hgt: usize);
    cuMemsetD2D32_v2_ptds => cuMemsetD2D32_v2(dst: u64, pitch: usize, v: u32, w: usize, hgt: usize);
    cuMemsetD2D8Async_ptsz => cuMemsetD2D8Async(dst: u64, pitch: usize, v: u8, w: usize, hgt: usize, s: Handle);
    cuMemsetD2D16Async_ptsz => cuMemsetD2D16Async(dst: u64, pitch: usize, v: u16, w: usize, hgt: usize, s: Handle);
    cuMemsetD2D32Async_ptsz => cuMemsetD2D32Async(dst: u64, pitch: usize, v: u32, w: usize, hgt: usize, s: Handle);
    cuMemAllocAsync_ptsz => cuMemAllocAsync(dptr: *mut u64, bytesize: usize, s: Handle);
    cuMemAllocFromPoolAsync_ptsz => cuMemAllocFromPoolAsync(dptr: *mut u64, bytesize: usize, pool: Handle, s: Handle);
    cuMemFreeAsync_ptsz => cuMemFreeAsync(dptr: u64, s: Handle);
}
