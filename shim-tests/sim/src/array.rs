//! CUDA arrays and mipmapped arrays: what they cost.
//!
//! Size model (the same number cuArrayGetMemoryRequirements / cuMipmappedArrayGetMemoryRequirements report,
//! and what is charged to the device): each level is rows of `width × element size` rounded up to 512 bytes,
//! times height (≥1), times depth or layers (≥1; a cubemap has 6 faces per layer); a mipmap sums its levels
//! (each dimension halved per level, layers not); the total is rounded up to the allocation granularity.

use crate::objects::{new_handle, Kind, Objects};
use crate::sim::Sim;
use crate::types::*;

const PITCH_ALIGN: u64 = 512;

/// Bytes per channel of a CUarray_format (None for formats the simulator does not model).
pub(crate) fn format_bytes(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => 1,        // UNORM/SNORM_INT8X1
        0xc1 | 0xc7 => 2,        // INT8X2
        0xc2 | 0xc8 => 4,        // INT8X4
        0xc3 | 0xc9 => 2,        // INT16X1
        0xc4 | 0xca => 4,        // INT16X2
        0xc5 | 0xcb => 8,        // INT16X4
        0x50 => 4,               // UNORM_INT_101010_2
        _ => return None,
    })
}

/// Bytes of one level of `d` (before granularity rounding).
fn level_bytes(d: &Array3DDescriptor, level: u32) -> CuResult<u64> {
    let elem = format_bytes(d.format).ok_or(CUDA_ERROR_INVALID_VALUE)? * d.num_channels as u64;
    let layered = d.flags & CUDA_ARRAY3D_LAYERED != 0;
    let cubemap = d.flags & CUDA_ARRAY3D_CUBEMAP != 0;
    let shrink = |v: usize| -> u64 { ((v as u64) >> level).max(1) };
    let w = shrink(d.width);
    let h = if d.height == 0 { 1 } else { shrink(d.height) };
    let depth = if d.depth == 0 {
        1
    } else if layered || cubemap {
        d.depth as u64
    } else {
        shrink(d.depth)
    };
    let row = (w * elem).div_ceil(PITCH_ALIGN) * PITCH_ALIGN;
    row.checked_mul(h)
        .and_then(|v| v.checked_mul(depth))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Validates a descriptor the way the driver does.
fn validate(d: &Array3DDescriptor) -> CuResult<()> {
    if d.width == 0 || !matches!(d.num_channels, 1 | 2 | 4) || format_bytes(d.format).is_none() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if d.depth > 0 && d.height == 0 && d.flags & CUDA_ARRAY3D_LAYERED == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if d.flags & CUDA_ARRAY3D_CUBEMAP != 0
        && (d.width != d.height || d.depth == 0 || !d.depth.is_multiple_of(6))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Bytes an array takes (rounded to `granularity`).
pub(crate) fn array_bytes(d: &Array3DDescriptor, granularity: u64) -> CuResult<u64> {
    validate(d)?;
    Ok(level_bytes(d, 0)?.div_ceil(granularity) * granularity)
}

/// Most mipmap levels a descriptor allows: ⌊log2(largest dimension)⌋ + 1.
pub(crate) fn max_levels(d: &Array3DDescriptor) -> u32 {
    let layered = d.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let m = d
        .width
        .max(d.height)
        .max(if layered { 0 } else { d.depth })
        .max(1);
    usize::BITS - m.leading_zeros()
}

/// Bytes a mipmapped array takes (all levels, rounded to `granularity`).
pub(crate) fn mipmap_bytes(d: &Array3DDescriptor, levels: u32, granularity: u64) -> CuResult<u64> {
    validate(d)?;
    if levels == 0 || levels > max_levels(d) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut total = 0u64;
    for l in 0..levels {
        total = total
            .checked_add(level_bytes(d, l)?)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    }
    Ok(total.div_ceil(granularity) * granularity)
}

/// An array.
pub(crate) struct Array {
    pub ctx: u64,
    pub phys: usize,
    pub desc: Array3DDescriptor,
    /// Bytes charged (0 for a mipmap level: the mipmap is charged).
    pub bytes: u64,
    /// Whether it is a level of a mipmapped array (destroyed with it).
    pub level_of: Option<u64>,
}

/// A mipmapped array.
pub(crate) struct Mipmap {
    pub ctx: u64,
    pub phys: usize,
    pub desc: Array3DDescriptor,
    pub levels: u32,
    pub bytes: u64,
    /// Level arrays handed out so far.
    pub level_arrays: Vec<(u32, u64)>,
}

/// cuArrayCreate / cuArray3DCreate in the current context.
pub(crate) fn create(o: &mut Objects, sim: &Sim, desc: Array3DDescriptor) -> CuResult<u64> {
    let ctx = crate::context::current(o, sim)?;
    let (_, phys) = crate::context::device_of(o, ctx)?;
    let mut bytes = array_bytes(&desc, sim.cfg.granularity)?;
    if desc.flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
        // Backed later by VMM allocations bound with cuMemMapArrayAsync.
        bytes = 0;
    }
    sim.charge(phys, bytes)?;
    let h = new_handle(Kind::Array);
    o.arrays.insert(
        h,
        Array {
            ctx,
            phys,
            desc,
            bytes,
            level_of: None,
        },
    );
    Ok(h)
}

/// cuArrayDestroy.
pub(crate) fn destroy(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    match o.arrays.get(&h) {
        Some(a) if a.level_of.is_none() => {}
        _ => return Err(CUDA_ERROR_INVALID_HANDLE),
    }
    let a = o.arrays.remove(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    sim.uncharge(a.phys, a.bytes);
    // What was bound to its tiles is unbound with it.
    crate::vmm::unbind_where(o, sim, |k| k.0 == h);
    Ok(())
}

/// cuMipmappedArrayCreate in the current context.
pub(crate) fn mipmap_create(
    o: &mut Objects,
    sim: &Sim,
    desc: Array3DDescriptor,
    levels: u32,
) -> CuResult<u64> {
    let ctx = crate::context::current(o, sim)?;
    let (_, phys) = crate::context::device_of(o, ctx)?;
    let mut bytes = mipmap_bytes(&desc, levels, sim.cfg.granularity)?;
    if desc.flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING) != 0 {
        // As a sparse array: backed later by VMM allocations bound with cuMemMapArrayAsync.
        bytes = 0;
    }
    sim.charge(phys, bytes)?;
    let h = new_handle(Kind::Mipmap);
    o.mipmaps.insert(
        h,
        Mipmap {
            ctx,
            phys,
            desc,
            levels,
            bytes,
            level_arrays: Vec::new(),
        },
    );
    Ok(h)
}

/// cuMipmappedArrayGetLevel: an array handle for one level (owned by the mipmap).
pub(crate) fn mipmap_level(o: &mut Objects, h: u64, level: u32) -> CuResult<u64> {
    let m = o.mipmaps.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if level >= m.levels {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(&(_, a)) = m.level_arrays.iter().find(|(l, _)| *l == level) {
        return Ok(a);
    }
    let mut desc = m.desc;
    let layered = desc.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    desc.width = (desc.width >> level).max(1);
    if desc.height > 0 {
        desc.height = (desc.height >> level).max(1);
    }
    if desc.depth > 0 && !layered {
        desc.depth = (desc.depth >> level).max(1);
    }
    let (ctx, phys) = (m.ctx, m.phys);
    let a = new_handle(Kind::Array);
    o.arrays.insert(
        a,
        Array {
            ctx,
            phys,
            desc,
            bytes: 0,
            level_of: Some(h),
        },
    );
    o.mipmaps
        .get_mut(&h)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .level_arrays
        .push((level, a));
    Ok(a)
}

/// cuMipmappedArrayDestroy.
pub(crate) fn mipmap_destroy(o: &mut Objects, sim: &Sim, h: u64) -> CuResult<()> {
    let m = o.mipmaps.remove(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for (_, a) in m.level_arrays {
        o.arrays.remove(&a);
    }
    sim.uncharge(m.phys, m.bytes);
    // What was bound to its tiles and mip tail is unbound with it.
    crate::vmm::unbind_where(o, sim, |k| k.0 == h);
    Ok(())
}

/// Destroys the arrays of a context being torn down.
pub(crate) fn destroy_for_context(o: &mut Objects, sim: &Sim, ctx: u64) {
    let arrays: Vec<u64> = o
        .arrays
        .iter()
        .filter(|(_, a)| a.ctx == ctx && a.level_of.is_none())
        .map(|(&h, _)| h)
        .collect();
    for h in arrays {
        let _ = destroy(o, sim, h);
    }
    let mips: Vec<u64> = o
        .mipmaps
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(&h, _)| h)
        .collect();
    for h in mips {
        let _ = mipmap_destroy(o, sim, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    fn d(w: usize, h: usize, depth: usize, format: u32, ch: u32, flags: u32) -> Array3DDescriptor {
        Array3DDescriptor {
            width: w,
            height: h,
            depth,
            format,
            num_channels: ch,
            flags,
        }
    }

    #[test]
    fn array_sizes() {
        // 1024×1024 float4: 16 KiB rows × 1024 = 16 MiB.
        assert_eq!(array_bytes(&d(1024, 1024, 0, 0x20, 4, 0), G), Ok(16 << 20));
        // 100×100 uchar: 512-byte rows × 100 = 51200 → one granule.
        assert_eq!(array_bytes(&d(100, 100, 0, 0x01, 1, 0), G), Ok(G));
        // 1D 4096 floats → 16 KiB → one granule.
        assert_eq!(array_bytes(&d(4096, 0, 0, 0x20, 1, 0), G), Ok(G));
        // 3D 256³ float: 1 KiB rows × 256 × 256 = 64 MiB.
        assert_eq!(array_bytes(&d(256, 256, 256, 0x20, 1, 0), G), Ok(64 << 20));
        // Layered: 8 layers of 512×512 half2 = 2 KiB × 512 × 8 = 8 MiB.
        assert_eq!(
            array_bytes(&d(512, 512, 8, 0x10, 2, CUDA_ARRAY3D_LAYERED), G),
            Ok(8 << 20)
        );
        assert_eq!(
            array_bytes(&d(0, 1, 0, 0x20, 1, 0), G),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(&d(1, 1, 0, 0x20, 3, 0), G),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(&d(1, 1, 0, 0x77, 1, 0), G),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(&d(64, 64, 5, 0x20, 1, CUDA_ARRAY3D_CUBEMAP), G),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn mipmap_sizes() {
        let desc = d(2048, 2048, 0, 0x20, 4, 0);
        assert_eq!(max_levels(&desc), 12);
        // Level 0: 32 KiB × 2048 = 64 MiB; level 1: 16 KiB × 1024 = 16 MiB; level 2: 8 KiB × 512 = 4 MiB.
        assert_eq!(mipmap_bytes(&desc, 1, G), Ok(64 << 20));
        assert_eq!(mipmap_bytes(&desc, 3, G), Ok(84 << 20));
        assert!(mipmap_bytes(&desc, 12, G).is_ok());
        assert_eq!(mipmap_bytes(&desc, 13, G), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(mipmap_bytes(&desc, 0, G), Err(CUDA_ERROR_INVALID_VALUE));
    }
}
