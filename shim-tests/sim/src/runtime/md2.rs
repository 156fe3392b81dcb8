//! MD2 (RFC 1319) and HMAC-MD2 (RFC 2104 with MD2's 16-byte block).
//!
//! Why this exists: the CUDA runtime's "integrity check" export table (see `export_table.rs`) asks the
//! driver for a keyed hash of facts both sides know (versions, ids, table addresses, device UUIDs and PCI
//! locations) and compares it with its own computation. Public reimplementations of the driver (ZLUDA's dark
//! API notes) document that hash as HMAC-MD2 with a fixed 16-byte key; this is our own implementation of the
//! two public standards, checked against the RFC 1319 test vectors.

/// MD2's substitution table ("PI_SUBST" in RFC 1319), a permutation of 0..=255 built from the digits of pi.
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, //
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202, //
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18, //
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122, //
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, //
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, //
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198, //
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241, //
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, //
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, //
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38, //
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82, //
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74, //
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, //
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, //
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
];

/// Streaming MD2 state.
#[derive(Clone)]
pub(crate) struct Md2 {
    x: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    filled: usize,
}

impl Md2 {
    /// A fresh digest.
    pub(crate) const fn new() -> Self {
        Self {
            x: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            filled: 0,
        }
    }

    /// Feeds bytes.
    pub(crate) fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.filled] = b;
            self.filled += 1;
            if self.filled == 16 {
                self.compress();
                self.filled = 0;
            }
        }
    }

    fn compress(&mut self) {
        // Checksum first (it only depends on the block and the previous checksum).
        let mut l = self.checksum[15];
        for j in 0..16 {
            self.checksum[j] ^= S[(self.block[j] ^ l) as usize];
            l = self.checksum[j];
        }
        for j in 0..16 {
            self.x[16 + j] = self.block[j];
            self.x[32 + j] = self.x[16 + j] ^ self.x[j];
        }
        let mut t: u8 = 0;
        for round in 0..18u8 {
            for k in 0..48 {
                self.x[k] ^= S[t as usize];
                t = self.x[k];
            }
            t = t.wrapping_add(round);
        }
    }

    /// Pads, appends the checksum and returns the 16-byte digest.
    pub(crate) fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.filled) as u8;
        self.update(&[pad; 16][..pad as usize]);
        let checksum = self.checksum;
        self.update(&checksum);
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

/// HMAC-MD2 with a key of exactly one block (16 bytes), over the concatenation of `parts`.
pub(crate) fn hmac_md2(key: &[u8; 16], parts: &[&[u8]]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&key.map(|k| k ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|k| k ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn md2(s: &str) -> String {
        let mut h = Md2::new();
        h.update(s.as_bytes());
        hex(h.finish())
    }

    #[test]
    fn rfc1319_vectors() {
        assert_eq!(md2(""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2("abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
    }

    #[test]
    fn s_is_a_permutation() {
        let mut seen = [false; 256];
        for &b in &S {
            assert!(!seen[b as usize]);
            seen[b as usize] = true;
        }
    }
}
