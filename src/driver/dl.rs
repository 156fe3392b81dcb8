//! glibc's own `dlsym`, `dlvsym`, `dlopen` and `dlmopen`, read from the dynamic symbol table of the loaded
//! `libc.so.6` (glibc 2.34+) or `libdl.so.2` (older glibc) through `dl_iterate_phdr`.
//!
//! We export all four, so no lookup by name can reach glibc's (`dlvsym(RTLD_NEXT, "dlsym", …)` would come back
//! to us); the library's ELF is the one route nothing can redirect. Only the default version of each name is
//! taken (`dlsym@@GLIBC_2.34`, not the compat `dlsym@GLIBC_2.2.5`; on older glibc the only one). 64-bit ELF.
//!
//! Safe at any time, from any thread, before anything is initialised: no lock of ours, no allocation (the
//! dynamic loader's own lock is taken by `dl_iterate_phdr`, recursively).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(test))]
pub(crate) use crate::ffi::dlfcn::DlmopenFn;
pub(crate) use crate::ffi::dlfcn::{DlopenFn, DlsymFn, DlvsymFn};

/// One of glibc's functions, resolved on first use: 0 = not yet, 1 = not found, else its address.
pub(crate) struct Real {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The address, or None when glibc does not define it (not glibc?). Racing first callers find the same.
    pub(crate) fn get(&self) -> Option<usize> {
        let mut a = self.addr.load(Ordering::Acquire);
        if a == 0 {
            a = glibc_symbol(self.name).unwrap_or(1);
            self.addr.store(a, Ordering::Release);
        }
        (a != 1).then_some(a)
    }
}

/// glibc's `dlsym`.
pub(crate) static DLSYM: Real = Real::new(c"dlsym");
/// glibc's `dlvsym`.
pub(crate) static DLVSYM: Real = Real::new(c"dlvsym");
/// glibc's `dlopen`.
pub(crate) static DLOPEN: Real = Real::new(c"dlopen");
/// glibc's `dlmopen`.
pub(crate) static DLMOPEN: Real = Real::new(c"dlmopen");

/// glibc's `dlsym`, typed.
pub(crate) fn real_dlsym() -> Option<DlsymFn> {
    // SAFETY: glibc's `dlsym` has exactly this signature (dlfcn.h).
    DLSYM
        .get()
        .map(|a| unsafe { std::mem::transmute::<usize, DlsymFn>(a) })
}

/// glibc's `dlvsym`, typed.
pub(crate) fn real_dlvsym() -> Option<DlvsymFn> {
    // SAFETY: glibc's `dlvsym` has exactly this signature (dlfcn.h).
    DLVSYM
        .get()
        .map(|a| unsafe { std::mem::transmute::<usize, DlvsymFn>(a) })
}

/// glibc's `dlopen`, typed.
pub(crate) fn real_dlopen() -> Option<DlopenFn> {
    // SAFETY: glibc's `dlopen` has exactly this signature (dlfcn.h).
    DLOPEN
        .get()
        .map(|a| unsafe { std::mem::transmute::<usize, DlopenFn>(a) })
}

/// Where `name` (default version) is defined in the loaded `libc.so*` or `libdl.so*`.
fn glibc_symbol(name: &CStr) -> Option<usize> {
    struct Search<'a> {
        name: &'a [u8],
        found: Option<usize>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes our `Search` back and a valid `info` for the duration of the call.
        let (s, info) = unsafe { (&mut *(data as *mut Search<'_>), &*info) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated object name.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
        // `libc.so.6` as the loader found it; `libc-2.31.so` where a distribution names the file itself.
        let glibc = [&b"libc.so"[..], b"libdl.so", b"libc-", b"libdl-"];
        if !glibc.iter().any(|p| base.starts_with(p)) {
            return 0;
        }
        // SAFETY: the phdrs of a loaded object, as the loader describes them.
        s.found = unsafe { lookup(info, s.name) };
        c_int::from(s.found.is_some())
    }
    let mut s = Search {
        name: name.to_bytes(),
        found: None,
    };
    // SAFETY: the callback only reads loader data for the duration of each call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut s as *mut Search<'_> as *mut c_void) };
    s.found
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `name`'s default-version definition in the object `info` describes.
///
/// # Safety
/// `info` describes a loaded object (its dynamic section and tables are mapped).
unsafe fn lookup(info: &libc::dl_phdr_info, name: &[u8]) -> Option<usize> {
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    // glibc relocates most d_ptr entries in place; the vDSO's and some architectures' stay offsets.
    let at = |v: u64| {
        if (v as usize) < base {
            base + v as usize
        } else {
            v as usize
        }
    };
    let (mut symtab, mut strtab, mut gnu, mut sysv, mut versym) = (0, 0, 0, 0, 0);
    loop {
        // SAFETY: the dynamic section ends with DT_NULL.
        let e = unsafe { &*d };
        match e.tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = at(e.val),
            DT_STRTAB => strtab = at(e.val),
            DT_GNU_HASH => gnu = at(e.val),
            DT_HASH => sysv = at(e.val),
            DT_VERSYM => versym = at(e.val),
            _ => {}
        }
        // SAFETY: still inside the section (DT_NULL not reached).
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return None;
    }
    let symtab = symtab as *const libc::Elf64_Sym;
    let matches = |i: u32| -> Option<usize> {
        // SAFETY: `i` comes from the object's own hash table, so it indexes its symbol table.
        let sym = unsafe { &*symtab.add(i as usize) };
        if sym.st_shndx == 0 || sym.st_value == 0 {
            return None;
        }
        // SAFETY: st_name is an offset into the string table, NUL-terminated.
        let sname = unsafe { CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char) };
        if sname.to_bytes() != name {
            return None;
        }
        // SAFETY: the version table has one entry per symbol.
        if versym != 0 && unsafe { *(versym as *const u16).add(i as usize) } & 0x8000 != 0 {
            return None; // a hidden (non-default) version
        }
        Some(base + sym.st_value as usize)
    };
    if gnu != 0 {
        let h = gnu as *const u32;
        // SAFETY: the GNU hash header: nbuckets, symoffset, bloom size, bloom shift, then the tables.
        let (nbuckets, symoffset, bloom) = unsafe { (*h, *h.add(1), *h.add(2)) };
        if nbuckets == 0 {
            return None;
        }
        // SAFETY: bloom words are pointer-sized; buckets and chains follow.
        let buckets = unsafe { (h.add(4) as *const usize).add(bloom as usize) } as *const u32;
        // SAFETY: as above.
        let chain = unsafe { buckets.add(nbuckets as usize) };
        let hash = name
            .iter()
            .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(u32::from(c)));
        // SAFETY: bucket index below nbuckets.
        let mut i = unsafe { *buckets.add((hash % nbuckets) as usize) };
        if i < symoffset {
            return None;
        }
        loop {
            // SAFETY: chain entries exist for every symbol from symoffset on, until one with the low bit set.
            let ch = unsafe { *chain.add((i - symoffset) as usize) };
            if ch | 1 == hash | 1 {
                if let Some(a) = matches(i) {
                    return Some(a);
                }
            }
            if ch & 1 != 0 {
                return None;
            }
            i += 1;
        }
    }
    if sysv != 0 {
        let h = sysv as *const u32;
        // SAFETY: the SysV hash header: nbucket, nchain, then buckets and chains.
        let nbucket = unsafe { *h };
        if nbucket == 0 {
            return None;
        }
        let hash = name.iter().fold(0u32, |mut h, &c| {
            h = (h << 4).wrapping_add(u32::from(c));
            let g = h & 0xf000_0000;
            if g != 0 {
                h ^= g >> 24;
            }
            h & !g
        });
        // SAFETY: bucket index below nbucket.
        let mut i = unsafe { *h.add(2 + (hash % nbucket) as usize) };
        while i != 0 {
            if let Some(a) = matches(i) {
                return Some(a);
            }
            // SAFETY: chain[i] for a symbol index i < nchain.
            i = unsafe { *h.add(2 + nbucket as usize + i as usize) };
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibcs_own_functions() {
        // The unit-test binary exports none of them, so the public lookup sees glibc's.
        for (real, name) in [
            (&DLSYM, c"dlsym"),
            (&DLVSYM, c"dlvsym"),
            (&DLOPEN, c"dlopen"),
            (&DLMOPEN, c"dlmopen"),
        ] {
            // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
            let public = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
            assert_eq!(real.get(), Some(public), "{name:?}");
        }
        assert_eq!(glibc_symbol(c"no_such_function_anywhere"), None);
        // A compat-only version (hidden) is not taken, the default one is: same address on glibc 2.34+.
        assert!(glibc_symbol(c"malloc").is_some());
    }
}
