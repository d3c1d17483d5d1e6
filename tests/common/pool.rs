//! A KV pool of the attention tests stored in one dtype: the encoded rows
//! in the form `KvRows` borrows, and the same rows decoded (what the kernels
//! see, for the float64 references).

use offgraph_kv::{KvDtype, KvRows};

pub struct Pool {
    pub dtype: KvDtype,
    f32s: Vec<f32>,
    u16s: Vec<u16>,
    bytes: Vec<u8>,
    pub decoded: Vec<f32>,
}

impl Pool {
    /// `values` encoded in `dtype` (NaN rows stay NaN, so a read of one shows).
    pub fn new(dtype: KvDtype, values: &[f32]) -> Pool {
        let mut bytes = vec![0u8; dtype.row_bytes(values.len())];
        assert!(offgraph_kv::dtype::encode(dtype, values, &mut bytes));
        let mut decoded = vec![0f32; values.len()];
        assert!(offgraph_kv::dtype::decode(dtype, &bytes, &mut decoded));
        let f32s = match dtype {
            KvDtype::Float32 => decoded.clone(),
            _ => Vec::new(),
        };
        let u16s = match dtype {
            KvDtype::Float16 | KvDtype::Bfloat16 => bytes
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
            _ => Vec::new(),
        };
        Pool {
            dtype,
            f32s,
            u16s,
            bytes,
            decoded,
        }
    }

    pub fn rows(&self) -> KvRows<'_> {
        match self.dtype {
            KvDtype::Float32 => KvRows::from_f32(&self.f32s),
            KvDtype::Float16 | KvDtype::Bfloat16 => KvRows::from_u16(self.dtype, &self.u16s),
            KvDtype::Q8_0 => KvRows {
                dtype: KvDtype::Q8_0,
                bytes: &self.bytes,
            },
        }
    }
}
