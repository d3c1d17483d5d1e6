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
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
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
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            30 => GgmlType::BF16,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "tensor type: expected one of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
                     Q4_K, Q5_K, Q6_K, Q8_K, got GGML type id {other}"
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
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
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
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::BF16 => "BF16",
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
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
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
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
    }
}
