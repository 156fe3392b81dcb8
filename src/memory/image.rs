//! What a module or library image will make the driver take at its first uses (lazy loading): read from the
//! image the program hands `cuModuleLoad*` / `cuLibraryLoad*`, so that a first use is admitted against the cap
//! before the driver takes it (`memory::reconcile`).
//!
//! The footprint is an upper bound of the code and globals one context's copy of the image can hold: in an ELF
//! cubin every section that occupies device memory (allocated sections, `.text.*`, `.nv.global*` including the
//! NOBITS ones that take no room in the image, `.nv.constant*`); in PTX the module-scope `.global` / `.const`
//! variables plus the text's length for the code it compiles to; in a fat binary the largest of the entries the
//! driver could load on the device (any one may be its choice; every entry where the device is not known;
//! compressed entries decompressed first). `None` (unknown) for what cannot be read: an
//! entry that is malformed, claims more than [`MAX_ENTRY`] bytes uncompressed or does not decompress to exactly
//! what its header says, an unparsable PTX declaration, any other format. Layouts: the System V ELF-64 ABI; the
//! fat-binary header and entry layout as public descriptions give it (ZLUDA's fatbin notes; checked against
//! nvcc 13.0's output, `testdata/`): `{u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 files_size}`,
//! each entry `{u16 kind (1 PTX, 2 ELF), u16, u32 header_size, u32 payload_size (padded), u32, u32
//! compressed_size @16, …, u32 arch @28 (`sm_90`: 90), …, u64 flags @40, u64, u64 uncompressed_size @56}`, an LZ4 block when flags has 0x2000
//! (older toolkits; nvcc 13's `--compress-mode=speed`), a Zstandard frame when 0x8000 (nvcc 13's default mode:
//! its PTX entries even without `-Xfatbin -compress-all`); the wrapper `{u32 magic 0x466243B1, u32 version,
//! u64 data, u64 prelinked}`.

/// Reads at most this much of a fat binary or a PTX text (a bound against a corrupt size).
const MAX_IMAGE: u64 = 1 << 32;
const WRAPPER_MAGIC: u32 = 0x466243B1;
const FATBIN_MAGIC: u32 = 0xBA55ED50;
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// An entry that decompresses to more than this is unreadable: the bound on what reading one may allocate (a
/// real library's entry is a few MiB).
const MAX_ENTRY: u64 = 256 << 20;
const SHF_ALLOC: u64 = 0x2;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The footprint of the image at `p` (`cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`,
/// `cuLibraryLoadData`). `inflate`: decompress compressed entries (else they make it unknown) — only while a
/// memory cap may apply: a framework loads hundreds of fat binaries at start-up. `arch`: the compute capability
/// (`major * 10 + minor`) of the device the image is loaded for, where known: a fat binary's entries the driver
/// could not load there are ignored ([`loadable`]); `None`: every entry counts.
///
/// # Safety
/// `p` is NULL or points to an image as those calls require (a complete ELF, a fat binary or its wrapper with
/// the entries its header counts, or NUL-terminated text): what the driver itself reads.
pub(crate) unsafe fn footprint_at(p: *const u8, inflate: bool, arch: Option<u32>) -> Option<u64> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every image is at least 4 bytes (contract).
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    match u32_at(head, 0)? {
        WRAPPER_MAGIC => {
            // SAFETY: a wrapper is 24 bytes: two u32 and two pointers.
            let w = unsafe { std::slice::from_raw_parts(p, 24) };
            let data = u64_at(w, 8)? as *const u8;
            if u32_at(w, 4)? != 1 || data.is_null() {
                return None; // prelinked lists (version 2): not read, unknown
            }
            // SAFETY: the wrapper's data is a fat binary (contract).
            unsafe { fatbin_at(data, inflate, arch) }
        }
        // SAFETY: as above.
        FATBIN_MAGIC => unsafe { fatbin_at(p, inflate, arch) },
        m if m.to_le_bytes() == ELF_MAGIC => {
            // SAFETY: an ELF header is 64 bytes; its section table lies where it says (a complete ELF).
            let h = unsafe { std::slice::from_raw_parts(p, 64) };
            let (off, len) = elf_table(h)?;
            // SAFETY: as above.
            let table = unsafe { std::slice::from_raw_parts(p.add(off), len) };
            let mut end = (off + len) as u64;
            for s in table.chunks_exact(64) {
                if u32_at(s, 4)? != 8 {
                    end = end.max(u64_at(s, 24)?.checked_add(u64_at(s, 32)?)?);
                }
            }
            if end > MAX_IMAGE {
                return None;
            }
            // SAFETY: every section with contents lies inside the image (a complete ELF).
            elf(unsafe { std::slice::from_raw_parts(p, end as usize) }, end)
        }
        _ => {
            // SAFETY: anything else is NUL-terminated text (contract).
            let text = unsafe { std::ffi::CStr::from_ptr(p.cast()) }.to_bytes();
            ptx(text)
        }
    }
}

/// The footprint of an image file's contents (`cuModuleLoad`, `cuLibraryLoadFromFile`); `inflate` and `arch`
/// as for [`footprint_at`].
pub(crate) fn footprint(data: &[u8], inflate: bool, arch: Option<u32>) -> Option<u64> {
    match u32_at(data, 0)? {
        FATBIN_MAGIC => fatbin(data, inflate, arch),
        m if m.to_le_bytes() == ELF_MAGIC => elf(data, data.len() as u64),
        _ => ptx(data.split(|&b| b == 0).next().unwrap_or(data)),
    }
}

/// Whether a file's contents can be handed to the driver from memory as they are: a binary format's headers
/// (a fat binary's entries, an ELF's section table and sections with contents) lie inside it. A fat-binary
/// wrapper holds pointers: no file format.
pub(crate) fn inside(data: &[u8]) -> bool {
    let len = data.len() as u64;
    match u32_at(data, 0) {
        Some(WRAPPER_MAGIC) => false,
        Some(FATBIN_MAGIC) => u16_at(data, 6)
            .zip(u64_at(data, 8))
            .is_some_and(|(h, n)| (h as u64).checked_add(n).is_some_and(|e| e <= len)),
        Some(m) if m.to_le_bytes() == ELF_MAGIC => data
            .get(..64)
            .and_then(elf_table)
            .and_then(|(off, n)| data.get(off..off.checked_add(n)?))
            .is_some_and(|table| {
                table.chunks_exact(64).all(|s| {
                    u32_at(s, 4) == Some(8)
                        || u64_at(s, 24)
                            .zip(u64_at(s, 32))
                            .and_then(|(o, n)| o.checked_add(n))
                            .is_some_and(|e| e <= len)
                })
            }),
        _ => true,
    }
}

/// # Safety
/// `p` points to a fat-binary header followed by `files_size` bytes of entries.
unsafe fn fatbin_at(p: *const u8, inflate: bool, arch: Option<u32>) -> Option<u64> {
    // SAFETY: a header is 16 bytes.
    let h = unsafe { std::slice::from_raw_parts(p, 16) };
    let end = (u16_at(h, 6)? as u64).checked_add(u64_at(h, 8)?)?;
    if end > MAX_IMAGE {
        return None;
    }
    // SAFETY: the header says how many bytes of entries follow it.
    fatbin(
        unsafe { std::slice::from_raw_parts(p, end as usize) },
        inflate,
        arch,
    )
}

/// Whether the driver could load a fat binary's entry of `kind` built for `sm` (its header's arch field, @28)
/// on a device of compute capability `dev` (both `major * 10 + minor`): a cubin of the device's major version
/// and a minor not above its own, or PTX for an architecture not above the device's (JIT-compiled). Wider than
/// the driver's choice (it takes only the best of these), never narrower: an entry it could take always counts.
/// Entries of another kind count (they make the footprint unknown). Arch-specific and family cubins carry their
/// base arch there and a flag (nvcc 13.0: `sm_90a` 90 with 0x100000, `sm_100f` 100 with 0x1200000): counted on
/// every device of that major and a minor not below it, wider than the driver again.
fn loadable(kind: u16, sm: u32, dev: u32) -> bool {
    match kind {
        KIND_ELF => sm / 10 == dev / 10 && sm <= dev,
        KIND_PTX => sm <= dev,
        _ => true,
    }
}

/// The largest entry of a fat binary the device `arch` could load (every entry when `None`), compressed ones
/// decompressed (`None` when any such entry is unreadable, of another kind, or compressed and not to be
/// inflated).
fn fatbin(b: &[u8], inflate: bool, arch: Option<u32>) -> Option<u64> {
    if u32_at(b, 0)? != FATBIN_MAGIC {
        return None;
    }
    let start = u16_at(b, 6)? as usize;
    let files = b.get(start..start.checked_add(usize::try_from(u64_at(b, 8)?).ok()?)?)?;
    let (mut at, mut most) = (0usize, 0u64);
    while at + 48 <= files.len() {
        let e = &files[at..];
        let (kind, ehsize, size) = (u16_at(e, 0)?, u32_at(e, 4)? as usize, u32_at(e, 8)? as usize);
        if ehsize < 48 {
            return None;
        }
        let flags = u64_at(e, 40)?;
        let compressed = flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
        let stored = match u32_at(e, 16)? as usize {
            n if compressed && n != 0 => n,
            _ => size,
        };
        let next = at.checked_add(ehsize)?.checked_add(size.max(stored))?;
        if arch.is_some_and(|dev| !loadable(kind, u32_at(e, 28).unwrap_or(0), dev)) {
            // Another GPU's code: the driver never reads it here.
            at = next;
            continue;
        }
        let payload = e.get(ehsize..ehsize.checked_add(stored)?)?;
        let plain;
        let payload = if compressed {
            if !inflate {
                return None;
            }
            plain = decompress(flags, payload, if ehsize >= 64 { u64_at(e, 56)? } else { 0 })?;
            &plain[..]
        } else {
            payload
        };
        let f = match kind {
            KIND_ELF => elf(payload, payload.len() as u64)?,
            KIND_PTX => ptx(payload.split(|&c| c == 0).next().unwrap_or(payload))?,
            _ => return None,
        };
        most = most.max(f);
        at = next;
    }
    Some(most)
}

/// A compressed entry's payload, which must decompress to exactly `size` bytes (its header's figure, at most
/// [`MAX_ENTRY`]: nothing beyond it is allocated or produced); `None` otherwise.
fn decompress(flags: u64, packed: &[u8], size: u64) -> Option<Vec<u8>> {
    if size == 0 || size > MAX_ENTRY {
        return None;
    }
    if flags & FLAG_ZSTD != 0 {
        use std::io::Read;
        let mut out = vec![0u8; size as usize];
        let mut dec = ruzstd::decoding::StreamingDecoder::new(packed).ok()?;
        dec.read_exact(&mut out).ok()?;
        // Exactly: a stream longer than claimed is as malformed as a shorter one.
        (dec.read(&mut [0u8; 1]).ok()? == 0).then_some(out)
    } else {
        // Decodes into a buffer of `size` bytes; a block that would write past it is an error.
        let out = lz4_flex::block::decompress(packed, size as usize).ok()?;
        (out.len() as u64 == size).then_some(out)
    }
}

/// Offset and length of an ELF-64 little-endian image's section table.
fn elf_table(h: &[u8]) -> Option<(usize, usize)> {
    if h.get(4..6)? != [2, 1] || u16_at(h, 0x3a)? != 64 {
        return None;
    }
    let (off, n) = (u64_at(h, 0x28)?, u16_at(h, 0x3c)? as u64);
    (off.checked_add(n * 64)? <= MAX_IMAGE).then_some((off as usize, n as usize * 64))
}

/// Sections that occupy device memory, summed; each at least the sizes of the variables its symbols declare in
/// it (a symbol larger than its section is taken at its own size), and every other object symbol at its size
/// wherever it claims to be (a section whose name or flags hide what it is, an index past the table): the driver
/// may allocate a global by its symbol alone. Sizes saturate (a total past the address space is refused, never
/// unknown). `limit`: the image's length where known (sections with contents must lie in it; NOBITS ones take
/// no room).
fn elf(b: &[u8], limit: u64) -> Option<u64> {
    let (off, len) = elf_table(b)?;
    let table = b.get(off..off + len)?;
    let strndx = u16_at(b, 0x3e)? as usize;
    let contents = |s: &[u8]| -> Option<&[u8]> {
        let (o, n) = (u64_at(s, 24)? as usize, u64_at(s, 32)? as usize);
        b.get(o..o.checked_add(n)?)
    };
    // Names from the string table's start to the image's end: a driver need not stop at the table's size.
    let names = table
        .get(strndx * 64..strndx * 64 + 64)
        .and_then(|s| b.get(u64_at(s, 24)? as usize..));
    // Per section: the sizes of the objects its symbols declare; `elsewhere`: objects in no section we list.
    let mut declared = vec![0u64; table.len() / 64];
    let mut elsewhere = 0u64;
    for s in table.chunks_exact(64).filter(|s| u32_at(s, 4) == Some(2)) {
        for sym in contents(s)?.chunks_exact(24) {
            let (info, shndx, size) = (sym[4], u16_at(sym, 6)? as usize, u64_at(sym, 16)?);
            if info & 0xf == 1 && shndx != 0 {
                let d = declared.get_mut(shndx).unwrap_or(&mut elsewhere);
                *d = d.saturating_add(size);
            }
        }
    }
    let mut sum = elsewhere;
    for (i, s) in table.chunks_exact(64).enumerate() {
        let (ty, flags, offset, size) = (u32_at(s, 4)?, u64_at(s, 8)?, u64_at(s, 24)?, u64_at(s, 32)?);
        if ty != 8 && offset.checked_add(size)? > limit {
            return None;
        }
        let name = names
            .and_then(|n| n.get(u32_at(s, 0)? as usize..))
            .map(|n| n.split(|&c| c == 0).next().unwrap_or(n))
            .unwrap_or(b"");
        let device = [&b".text"[..], b".nv.global", b".nv.constant"]
            .iter()
            .any(|p| name.starts_with(p));
        let takes = if flags & SHF_ALLOC != 0 || device {
            size.max(declared[i])
        } else {
            declared[i]
        };
        sum = sum.saturating_add(takes);
    }
    Some(sum)
}

/// Bytes of a PTX fundamental type.
fn ptx_type(t: &str) -> Option<u64> {
    let t = t.strip_prefix('.')?;
    if t == "pred" {
        return Some(1);
    }
    let (kind, bits) = t.split_at(1);
    let bits: u64 = bits.parse().ok()?;
    matches!(kind, "b" | "u" | "s" | "f").then_some(bits.div_ceil(8))
}

/// A PTX integer literal: decimal, hex (`0x`), octal (leading `0`) or binary (`0b`), with an optional `U`.
fn ptx_int(d: &str) -> Option<u64> {
    let d = d.strip_suffix(['U', 'u']).unwrap_or(d);
    let (digits, radix) = match d.get(..2) {
        Some("0x" | "0X") => (&d[2..], 16),
        Some("0b" | "0B") => (&d[2..], 2),
        _ if d.len() > 1 && d.starts_with('0') => (&d[1..], 8),
        _ => (d, 10),
    };
    u64::from_str_radix(digits, radix).ok()
}

/// Module-scope `.global` / `.const` variables of PTX text plus the text's length (its compiled code is of that
/// order); `None` when a declaration's size cannot be read.
fn ptx(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    if !text.contains(".version") {
        return None; // not PTX: an unknown format
    }
    let mut sum = text.len() as u64;
    // Every statement, bodies included (a `.global` declaration is never an instruction's token).
    for stmt in text.split(';') {
        if !(stmt.contains(".global") || stmt.contains(".const")) {
            continue; // cheap: most statements are instructions
        }
        // Braces are spaces here: `}.global` after a body is a module-scope declaration.
        let stmt: String = stmt
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ")
            .replace(['{', '}'], " ");
        let toks: Vec<&str> = stmt.split_whitespace().collect();
        if toks.contains(&".extern") || !toks.iter().any(|t| *t == ".global" || *t == ".const") {
            continue;
        }
        let ti = toks.iter().position(|t| ptx_type(t).is_some())?;
        let decl = toks[ti + 1..].join(" ");
        let (lhs, init) = match decl.split_once('=') {
            Some((l, r)) => (l, Some(r)),
            None => (decl.as_str(), None),
        };
        // A vector type (`.v2`, `.v4`) before the element's multiplies it.
        let lanes: u64 = toks[..ti]
            .iter()
            .filter_map(|t| t.strip_prefix(".v")?.parse::<u64>().ok())
            .product();
        let mut bytes = ptx_type(toks[ti])?.saturating_mul(lanes);
        for dim in lhs.split('[').skip(1) {
            let d = dim.split(']').next()?.trim();
            let n = if d.is_empty() {
                init?.split(',').count() as u64
            } else {
                ptx_int(d)?
            };
            bytes = bytes.saturating_mul(n);
        }
        sum = sum.saturating_add(bytes);
    }
    Some(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF-64 cubin with a `.text.k` of 256 bytes and a NOBITS `.nv.global` of `global` bytes.
    fn cubin(global: u64) -> Vec<u8> {
        let names = b"\0.text.k\0.nv.global\0.shstrtab\0";
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        let text_off = b.len() as u64;
        b.extend(std::iter::repeat_n(0, 256));
        let names_off = b.len() as u64;
        b.extend_from_slice(names);
        let shoff = b.len() as u64;
        let section = |name: u32, ty: u32, flags: u64, off: u64, size: u64| {
            let mut s = vec![0u8; 64];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4..8].copy_from_slice(&ty.to_le_bytes());
            s[8..16].copy_from_slice(&flags.to_le_bytes());
            s[24..32].copy_from_slice(&off.to_le_bytes());
            s[32..40].copy_from_slice(&size.to_le_bytes());
            s
        };
        b.extend(section(0, 0, 0, 0, 0));
        b.extend(section(1, 1, 0x6, text_off, 256));
        b.extend(section(9, 8, 0, names_off, global)); // no SHF_ALLOC: still device memory by its name
        b.extend(section(20, 3, 0, names_off, names.len() as u64));
        b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&4u16.to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&3u16.to_le_bytes());
        b
    }

    fn fatbin_of(entries: &[(u16, u64, Vec<u8>)]) -> Vec<u8> {
        let mut files = Vec::new();
        for (kind, flags, payload) in entries {
            let mut e = vec![0u8; 64];
            e[0..2].copy_from_slice(&kind.to_le_bytes());
            e[4..8].copy_from_slice(&64u32.to_le_bytes());
            e[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            e[40..48].copy_from_slice(&flags.to_le_bytes());
            files.extend(e);
            files.extend(payload);
        }
        let mut b = vec![0u8; 16];
        b[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        b[6..8].copy_from_slice(&16u16.to_le_bytes());
        b[8..16].copy_from_slice(&(files.len() as u64).to_le_bytes());
        b.extend(files);
        b
    }

    #[test]
    fn cubin_globals_and_code() {
        let c = cubin(3 << 30);
        assert_eq!(footprint(&c, true, None), Some((3 << 30) + 256));
        // SAFETY: a complete image in memory.
        let at = unsafe { footprint_at(c.as_ptr(), true, None) };
        assert_eq!(at, Some((3 << 30) + 256));
        assert_eq!(footprint(&c[..c.len() - 1], true, None), None, "truncated");
    }

    #[test]
    fn lying_cubins_are_bounded_not_unknown() {
        // `.nv.global` neither SHF_ALLOC nor named (its name past a 1-byte `.shstrtab`), 3 GiB by its symbol.
        let mut c = cubin(0);
        let shoff = u64_at(&c, 0x28).unwrap() as usize;
        c[shoff + 2 * 64 + 32..shoff + 2 * 64 + 40].copy_from_slice(&(3u64 << 30).to_le_bytes());
        c[shoff + 3 * 64 + 32..shoff + 3 * 64 + 40].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            footprint(&c, true, None),
            Some((3 << 30) + 256),
            "its name read past the table's size, as a driver may"
        );
        // Literals in every base (one statement's dimensions multiply: an over-estimate).
        let t = b".version 8.0\n.global .b8 g[0x10], h[010], i[0b11], j[2U];\n";
        assert_eq!(ptx(t), Some(t.len() as u64 + 16 * 8 * 3 * 2));
        let huge = format!(".version 8.0\n.global .b64 g[{}];\n", u64::MAX);
        assert_eq!(ptx(huge.as_bytes()), Some(u64::MAX), "saturates, never unknown");
        assert!(inside(&cubin(4096)));
        assert!(!inside(&cubin(4096)[..100]), "a section table past the end");
    }

    #[test]
    fn fatbin_takes_the_largest_entry() {
        let ptx = b".version 8.0\n.target sm_90\n.visible .global .align 4 .b8 g[1048576];\n".to_vec();
        let f = fatbin_of(&[(KIND_ELF, 0, cubin(4096)), (KIND_PTX, 0, ptx.clone())]);
        assert_eq!(footprint(&f, true, None), Some((1 << 20) + ptx.len() as u64));
    }

    /// A fat binary whose entries carry the architectures `sm`.
    fn fatbin_sm(entries: &[(u16, u32, Vec<u8>)]) -> Vec<u8> {
        let plain: Vec<_> = entries.iter().map(|(k, _, p)| (*k, 0, p.clone())).collect();
        let mut f = fatbin_of(&plain);
        let mut at = 16;
        for (_, sm, p) in entries {
            f[at + 28..at + 32].copy_from_slice(&sm.to_le_bytes());
            at += 64 + p.len();
        }
        f
    }

    #[test]
    fn only_entries_the_device_could_load_count() {
        let junk = vec![0xee; 64];
        let g = |sm| fatbin_sm(&[(KIND_ELF, sm, junk.clone()), (KIND_ELF, 90, cubin(3 << 30))]);
        // Another GPU's unreadable entry: ignored on a 9.0 device, unknown where the device is not known.
        assert_eq!(footprint(&g(80), true, Some(90)), Some((3 << 30) + 256));
        assert_eq!(footprint(&g(100), true, Some(90)), Some((3 << 30) + 256));
        assert_eq!(footprint(&g(80), true, None), None);
        // One the device could load (its own arch, a lower minor of its major): unknown, as before.
        assert_eq!(footprint(&g(90), true, Some(90)), None);
        assert_eq!(footprint(&g(86), true, Some(89)), None);
        // PTX for any arch not above the device's is JIT-compiled there: it counts.
        let p = |sm| fatbin_sm(&[(KIND_PTX, sm, junk.clone()), (KIND_ELF, 90, cubin(4096))]);
        assert_eq!(footprint(&p(80), true, Some(90)), None);
        assert_eq!(footprint(&p(100), true, Some(90)), Some(4096 + 256));
        // A device the image has no code for: nothing counts (the driver refuses the load).
        assert_eq!(footprint(&g(80), true, Some(120)), Some(0));
        assert!(
            loadable(KIND_ELF, 100, 103) && !loadable(KIND_ELF, 103, 100) && !loadable(KIND_ELF, 90, 100)
        );
        assert!(loadable(7, 0, 90), "another kind: counted (unknown)");
    }

    /// nvcc 13.0's own fat binaries of `testdata/global3g.cu` (a 3 GiB `__device__` global): plain cubin with a
    /// Zstandard PTX entry (the default), everything Zstandard, everything LZ4. Each is read at least 3 GiB.
    #[test]
    fn nvcc_compressed_fat_binaries() {
        for (name, f) in [
            ("default", &include_bytes!("testdata/global3g_default.fatbin")[..]),
            ("zstd", &include_bytes!("testdata/global3g_zstd.fatbin")[..]),
            ("lz4", &include_bytes!("testdata/global3g_lz4.fatbin")[..]),
        ] {
            let fp = footprint(f, true, None);
            assert!(fp.is_some_and(|b| b >= (3 << 30) + 4096), "{name}: {fp:?}");
            // SAFETY: a complete fat binary in memory.
            assert_eq!(unsafe { footprint_at(f.as_ptr(), true, None) }, fp, "{name}");
            assert_eq!(footprint(f, false, None), None, "{name}: not inflated");
            assert_eq!(footprint(f, true, Some(90)), fp, "{name}: sm_90's entries");
        }
    }

    /// Hand-made compressed entries: an LZ4 block of literals only and a Zstandard frame of one raw block.
    fn lz4_literals(b: &[u8]) -> Vec<u8> {
        let mut out = vec![0xf0];
        let mut n = b.len() - 15;
        while n >= 255 {
            out.push(255);
            n -= 255;
        }
        out.push(n as u8);
        out.extend_from_slice(b);
        out
    }
    fn zstd_raw(b: &[u8]) -> Vec<u8> {
        let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0x60];
        out.extend_from_slice(&((b.len() - 256) as u16).to_le_bytes());
        out.extend_from_slice(&((b.len() as u32) << 3 | 1).to_le_bytes()[..3]);
        out.extend_from_slice(b);
        out
    }
    fn compressed(flags: u64, packed: Vec<u8>, size: u64) -> Vec<u8> {
        let mut f = fatbin_of(&[(KIND_ELF, flags, packed.clone())]);
        f[16 + 16..16 + 20].copy_from_slice(&(packed.len() as u32).to_le_bytes());
        f[16 + 56..16 + 64].copy_from_slice(&size.to_le_bytes());
        f
    }

    fn footprint_c(b: &[u8]) -> Option<u64> {
        footprint(b, true, None)
    }

    #[test]
    fn compressed_entries_bounded() {
        let c = cubin(3 << 30);
        let n = c.len() as u64;
        for (flags, packed) in [(FLAG_LZ4, lz4_literals(&c)), (FLAG_ZSTD, zstd_raw(&c))] {
            assert_eq!(
                footprint_c(&compressed(flags, packed.clone(), n)),
                Some((3 << 30) + 256)
            );
            // A size that is not the stream's, one past the bound, a truncated stream: unreadable.
            assert_eq!(
                footprint_c(&compressed(flags, packed.clone(), n - 1)),
                None,
                "{flags:#x}"
            );
            assert_eq!(
                footprint_c(&compressed(flags, packed.clone(), n + 1)),
                None,
                "{flags:#x}"
            );
            assert_eq!(
                footprint_c(&compressed(flags, packed.clone(), MAX_ENTRY + 1)),
                None,
                "{flags:#x}"
            );
            assert_eq!(
                footprint_c(&compressed(flags, packed.clone(), 0)),
                None,
                "{flags:#x}"
            );
            let cut = packed[..packed.len() - 8].to_vec();
            assert_eq!(footprint_c(&compressed(flags, cut, n)), None, "{flags:#x}");
        }
    }

    #[test]
    fn ptx_variables() {
        let t = ".version 8.0\n.global .u32 x;\n.const .align 8 .b64 t[2][3];\n.extern .global .b8 e[9];\n\
                 .visible .entry k() { ld.global.u32 %r1, [x]; ret; }.global .b8 i[] = {1, 2, 3};\n\
                 .global .v4 .f32 v[2];\n";
        assert_eq!(ptx(t.as_bytes()), Some(t.len() as u64 + 4 + 48 + 3 + 32));
        assert_eq!(
            ptx(b".version 8.0\n.global .b8 g[N];\n"),
            None,
            "an unreadable size"
        );
        assert_eq!(ptx(b"CUDASIM-MODULE 1\n"), None, "not PTX");
    }
}
