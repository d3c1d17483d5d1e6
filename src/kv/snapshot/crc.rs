//! CRC-32 as zlib, PNG and gzip compute it (reflected polynomial 0xEDB88320,
//! initial value and final xor 0xFFFFFFFF), so `zlib.crc32` in Python checks
//! the same bytes. Slicing-by-8: eight 256-entry tables built at compile time,
//! eight bytes per round; no dependency.

const POLY: u32 = 0xEDB8_8320;

// Runs at compile time only: an out-of-range index would fail the build.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut s = 1;
        while s < 8 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            s += 1;
        }
        i += 1;
    }
    t
}

static TABLES: [[u32; 256]; 8] = tables();

/// The table entry; every index is masked to 0..=255, so `get` never misses.
#[inline(always)]
fn t(table: usize, byte: u32) -> u32 {
    TABLES
        .get(table)
        .and_then(|row| row.get((byte & 0xFF) as usize))
        .copied()
        .unwrap_or(0)
}

/// CRC-32 (zlib's) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    let mut chunks = data.chunks_exact(8);
    for ch in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(ch);
        let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ c;
        let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        c = t(7, lo)
            ^ t(6, lo >> 8)
            ^ t(5, lo >> 16)
            ^ t(4, lo >> 24)
            ^ t(3, hi)
            ^ t(2, hi >> 8)
            ^ t(1, hi >> 16)
            ^ t(0, hi >> 24);
    }
    for &b in chunks.remainder() {
        c = (c >> 8) ^ t(0, c ^ u32::from(b));
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::crc32;

    #[test]
    fn known_values() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }
}
