//! CRC-32 as zlib, PNG and gzip compute it (reflected polynomial 0xEDB88320,
//! initial value and final xor 0xFFFFFFFF), so `zlib.crc32` in Python checks
//! the same bytes. `crc32fast` folds with carry-less multiplies where the CPU
//! has them (PCLMULQDQ on x86-64, PMULL on aarch64), several GB/s: a store
//! load checks every row once, so this pass sets its speed.

/// CRC-32 (zlib's) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
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
