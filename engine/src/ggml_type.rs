//! GGML tensor types: their ids in a GGUF file, block sizes and byte sizes.
//!
//! Only the types the engine computes with are variants; any other id is
//! refused as [`EngineError::Unsupported`] with its number, so a file with an
//! exotic type fails at open, not at the first matmul.

use crate::error::{EngineError, Result};

/// A tensor's stored type.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
    IQ4_NL,
    IQ4_XS,
}

impl GgmlType {
    /// The type for a GGUF type id.
    pub fn from_id(id: u32) -> Result<GgmlType> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "tensor type: expected one of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
                     Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, got GGML type id {other}"
                )))
            }
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
        }
    }

    /// The name llama.cpp prints.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::BF16 => "BF16",
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL => 32,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ4_XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            // 16 scale/min bytes, 64 bytes of 2-bit quants, d, dmin.
            GgmlType::Q2_K => 84,
            // 32 high-bit bytes, 64 bytes of 2-bit quants, 12 scale bytes, d.
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
            // d, 16 bytes of 4-bit indices into the non-linear table.
            GgmlType::IQ4_NL => 18,
            // d, 2 bytes of scale high bits, 4 of scale low nibbles, 128 of indices.
            GgmlType::IQ4_XS => 136,
        }
    }

    /// Bytes of a row of `n` values: `Format` when `n` is not a whole number
    /// of blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Result<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return Err(EngineError::Format(format!(
                "{} row: expected a multiple of {bl} values, got {n}",
                self.name()
            )));
        }
        (n / bl)
            .checked_mul(self.block_bytes() as u64)
            .ok_or_else(|| {
                EngineError::Format(format!("{} row of {n} values overflows", self.name()))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_refused() {
        for id in 0..64u32 {
            match GgmlType::from_id(id) {
                Ok(t) => assert_eq!(t.id(), id),
                Err(e) => assert!(matches!(e, EngineError::Unsupported(_)), "{e}"),
            }
        }
        assert_eq!(GgmlType::Q4_K.row_bytes(512).ok(), Some(288));
        assert!(GgmlType::Q4_K.row_bytes(100).is_err());
        assert!(GgmlType::Q8_0.row_bytes(u64::MAX - 31).is_err());
        assert_eq!(
            GgmlType::Q8_0.row_bytes(u64::MAX / 34 / 32 * 32).ok(),
            Some(u64::MAX / 34 / 32 * 34)
        );
        assert!(GgmlType::F32.row_bytes(u64::MAX).is_err());
        // GGML's sizes for the low-bit types, from their ids.
        for (id, name, len, bytes) in [
            (10, "Q2_K", 256, 84),
            (11, "Q3_K", 256, 110),
            (20, "IQ4_NL", 32, 18),
            (23, "IQ4_XS", 256, 136),
        ] {
            let got = GgmlType::from_id(id).map(|t| (t.name(), t.block_len(), t.block_bytes()));
            assert_eq!(got.ok(), Some((name, len, bytes)));
        }
    }
}
