//! A private copy of an in-memory module or library image, taken before the driver's call while a memory cap
//! applies: the driver is handed the copy and the footprint is read from it, so another thread rewriting the
//! program's image during the load cannot show the driver one image and the library another. Its extent comes
//! from its own headers (a fat binary's header size plus its entries'; an ELF's header, section and program
//! header tables and the contents they point to; text up to its NUL), bounded by [`MAX`]. The headers may change
//! between that read and the copy: the copy's own extent is checked to lie inside it.

use std::ffi::c_void;

/// Larger images are refused (the footprint reader's own bound).
const MAX: u64 = 1 << 32;
const WRAPPER_MAGIC: u32 = 0x466243B1;
const FATBIN_MAGIC: u32 = 0xBA55ED50;

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as u64)
}
fn u32_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as u64)
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Bytes a binary image spans by its headers, read through `at(offset, len)`: `Some(None)` for text (NUL-
/// terminated), `None` when the extent cannot be read or passes [`MAX`].
fn extent(at: &mut dyn FnMut(u64, u64) -> Option<Vec<u8>>) -> Option<Option<u64>> {
    let head = at(0, 4)?;
    let end = match u32_at(&head, 0)? {
        m if m == FATBIN_MAGIC as u64 => {
            let h = at(0, 16)?;
            (u16_at(&h, 6)?.checked_add(u64_at(&h, 8)?)?).max(16)
        }
        m if m == WRAPPER_MAGIC as u64 => return None,
        _ if head == [0x7f, b'E', b'L', b'F'] => {
            let h = at(0, 64)?;
            if h.get(4..6)? != [2, 1] {
                return None; // not ELF-64 little-endian: no cubin
            }
            let mut end = 64u64;
            // (offset, count, entry size, where its offset and size lie in an entry, whether an entry counts)
            let tables = [
                (u64_at(&h, 0x28)?, u16_at(&h, 0x3c)?, u16_at(&h, 0x3a)?, (24, 32)),
                (u64_at(&h, 0x20)?, u16_at(&h, 0x38)?, u16_at(&h, 0x36)?, (8, 32)),
            ];
            for (i, (off, n, size, (o, s))) in tables.into_iter().enumerate() {
                if n == 0 {
                    if i == 0 && off != 0 {
                        return None; // extended section numbering: not read
                    }
                    continue;
                }
                if size < (if i == 0 { 64 } else { 56 }) {
                    return None;
                }
                let len = n * size;
                end = end.max(off.checked_add(len)?);
                if end > MAX {
                    return None;
                }
                let t = at(off, len)?;
                for e in t.chunks_exact(size as usize) {
                    // NOBITS sections take no room in the image.
                    if i == 0 && u32_at(e, 4)? == 8 {
                        continue;
                    }
                    end = end.max(u64_at(e, o)?.checked_add(u64_at(e, s)?)?);
                }
            }
            end
        }
        _ => return Some(None),
    };
    (end <= MAX).then_some(Some(end))
}

/// An image copied out of the program's memory, 8-byte aligned, followed by 8 NULs.
pub(crate) struct ImageCopy {
    buf: Vec<u64>,
    /// Where the image (for a wrapper: the fat binary it points to) lies in `buf`, in bytes, and its length.
    at: usize,
    len: usize,
    /// A fat-binary wrapper's version (the driver is handed a wrapper of ours at the start of `buf`).
    wrapper: Option<u32>,
}

// SAFETY: the buffer is ours; the wrapper's pointer points into it (its heap block never moves).
unsafe impl Send for ImageCopy {}

impl ImageCopy {
    /// What the driver is handed in place of the program's image.
    pub(crate) fn ptr(&self) -> *const c_void {
        self.buf.as_ptr().cast()
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `buf` holds `at + len` initialised bytes (see `take`).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>().add(self.at), self.len) }
    }

    /// The copy's footprint (`memory::image`): what the driver loads from it. Copies are made only under a
    /// memory cap, so compressed entries are always inflated; `arch` as `memory::image::footprint_at` takes it.
    pub(crate) fn footprint(&self, arch: Option<u32>) -> Option<u64> {
        match self.wrapper {
            Some(v) if v != 1 => None, // prelinked lists: unknown, as the reader answers for the original
            _ => crate::memory::image_footprint(self.bytes(), true, arch),
        }
    }
}

/// Copies `len` bytes at `p` (program memory) into a zeroed, aligned buffer at byte `at`, plus 8 NULs.
///
/// # Safety
/// `len` bytes at `p` are readable.
unsafe fn take(p: *const u8, at: usize, len: usize) -> Vec<u64> {
    let mut buf = vec![0u64; (at + len).div_ceil(8) + 1];
    // SAFETY: the caller's contract; `buf` holds `at + len + 8` bytes.
    unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().cast::<u8>().add(at), len) };
    buf
}

/// The image at `p` (`cuModuleLoadData`, `…Ex`, `cuModuleLoadFatBinary`, `cuLibraryLoadData`) copied whole.
/// `None`: its extent cannot be read, is past [`MAX`], or its headers changed to point outside the copy.
///
/// # Safety
/// `p` points to an image as those calls require (what the driver itself reads).
pub(crate) unsafe fn copy(p: *const c_void) -> Option<ImageCopy> {
    if p.is_null() {
        return None;
    }
    let p = p.cast::<u8>();
    // SAFETY: every image is at least 4 bytes (contract).
    let head = unsafe { take(p, 0, 4) };
    let (src, wrapper) = if head[0] as u32 == WRAPPER_MAGIC {
        // SAFETY: a wrapper is 24 bytes: two u32 and two pointers.
        let w = unsafe { take(p, 0, 24) };
        let data = w[1] as *const u8;
        (data, Some(w))
    } else {
        (p, None)
    };
    if src.is_null() {
        return None;
    }
    let mut from_program = |off: u64, len: u64| -> Option<Vec<u8>> {
        let end = off.checked_add(len)?;
        (end <= MAX).then_some(())?;
        let mut v = vec![0u8; len as usize];
        // SAFETY: the image spans what its headers say (contract); bounded by MAX.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off as usize), v.as_mut_ptr(), len as usize) };
        Some(v)
    };
    let len = match extent(&mut from_program)? {
        Some(n) => n as usize,
        // SAFETY: text is NUL-terminated (contract); read at most MAX bytes.
        None => unsafe { libc::strnlen(src.cast(), MAX as usize) },
    };
    if len as u64 >= MAX {
        return None;
    }
    let at = if wrapper.is_some() { 24 } else { 0 };
    if wrapper.is_some() && len < 16 {
        return None;
    }
    // SAFETY: `len` bytes of the image are readable (its extent as its headers said, or its text).
    let mut buf = unsafe { take(src, at, len) };
    let mut c = ImageCopy {
        buf: Vec::new(),
        at,
        len,
        wrapper: None,
    };
    if let Some(w) = wrapper {
        // Our wrapper: the program's magic, version and prelinked list, the data our copy.
        buf[0] = w[0];
        buf[2] = w[2];
        c.wrapper = Some((w[0] >> 32) as u32);
    }
    c.buf = buf;
    if let Some(w) = c.wrapper.map(|_| c.buf.as_ptr() as u64 + 24) {
        c.buf[1] = w;
    }
    // The copy's own headers, as the driver will read them, must lie inside it.
    let b = c.bytes();
    let mut from_copy = |off: u64, n: u64| {
        b.get(off as usize..off.checked_add(n)? as usize)
            .map(<[u8]>::to_vec)
    };
    match extent(&mut from_copy) {
        Some(Some(e)) if e <= len as u64 => {}
        Some(None) if c.wrapper.is_none() => {}
        _ => return None,
    }
    if c.wrapper.is_some() && u32_at(c.bytes(), 0) != Some(FATBIN_MAGIC as u64) {
        return None;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_fatbin_copies() {
        let t = b".version 8.0\n.global .b8 g[1048576];\n\0garbage";
        // SAFETY: NUL-terminated text.
        let c = unsafe { copy(t.as_ptr().cast()) }.unwrap();
        assert_eq!(c.len, t.len() - 8);
        assert_eq!(c.footprint(None), Some((c.len + (1 << 20)) as u64));
        let mut f = [0u8; 16 + 64];
        f[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f[6..8].copy_from_slice(&16u16.to_le_bytes());
        f[8..16].copy_from_slice(&64u64.to_le_bytes());
        f[16..18].copy_from_slice(&2u16.to_le_bytes()); // one ELF entry of no payload: unreadable
        f[20..24].copy_from_slice(&64u32.to_le_bytes());
        // SAFETY: a complete fat binary.
        let c = unsafe { copy(f.as_ptr().cast()) }.unwrap();
        assert_eq!(c.bytes(), &f[..]);
        let mut w = [0u64; 3];
        w[0] = WRAPPER_MAGIC as u64 | (1 << 32);
        w[1] = f.as_ptr() as u64;
        // SAFETY: a wrapper of a complete fat binary.
        let c = unsafe { copy(w.as_ptr().cast()) }.unwrap();
        assert_eq!(c.bytes(), &f[..]);
        assert_eq!(
            c.buf[1],
            c.buf.as_ptr() as u64 + 24,
            "our wrapper points at our copy"
        );
        // A header that says more than MAX: refused.
        f[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        // SAFETY: the header is read first; its extent is refused before anything past it.
        assert!(unsafe { copy(f.as_ptr().cast()) }.is_none());
    }
}
