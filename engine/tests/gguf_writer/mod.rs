//! A small GGUF writer for the loader's tests: typed metadata, raw metadata
//! entries (for hostile lengths and types) and tensors whose dims, type id
//! and offset are written exactly as given, so bad files are easy to make.
#![allow(dead_code)]

use offgraph_kv_engine::gguf::Value;

/// One tensor to write: `dims`, `ty_id` and `offset` go into the file as
/// they are; `data` is placed at the next aligned position of the data
/// section (and its relative position is the offset unless overridden).
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty_id: u32,
    pub data: Vec<u8>,
    pub offset: Option<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, dims: &[u64], ty_id: u32, data: Vec<u8>) -> Self {
        TensorSpec {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ty_id,
            data,
            offset: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub magic: [u8; 4],
    pub version: u32,
    pub kvs: Vec<(String, Value)>,
    /// Entries written after `kvs`: key, value type id, payload bytes.
    pub raw_kvs: Vec<(String, u32, Vec<u8>)>,
    pub tensors: Vec<TensorSpec>,
}

/// What was written, and where.
pub struct Built {
    pub bytes: Vec<u8>,
    pub data_offset: u64,
    /// Absolute offset where each tensor's data was placed.
    pub placed: Vec<u64>,
}

pub fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The value's payload (without its type id).
pub fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let ty = items.first().map(value_type).unwrap_or(0);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl Default for GgufBuilder {
    fn default() -> Self {
        GgufBuilder {
            magic: *b"GGUF",
            version: 3,
            kvs: Vec::new(),
            raw_kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufBuilder {
    pub fn kv(mut self, key: &str, v: Value) -> Self {
        self.kvs.push((key.to_owned(), v));
        self
    }

    pub fn raw_kv(mut self, key: &str, ty: u32, payload: Vec<u8>) -> Self {
        self.raw_kvs.push((key.to_owned(), ty, payload));
        self
    }

    pub fn tensor(mut self, t: TensorSpec) -> Self {
        self.tensors.push(t);
        self
    }

    /// The alignment the data is laid out with: a valid `general.alignment`, else 32.
    pub fn layout_alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", Value::U32(a)) if a.is_power_of_two() => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(32)
    }

    pub fn build(&self) -> Built {
        let align = self.layout_alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&((self.kvs.len() + self.raw_kvs.len()) as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        for (k, ty, payload) in &self.raw_kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(payload);
        }
        // Relative placement of each tensor's data.
        let mut rel = Vec::new();
        let mut pos = 0u64;
        for t in &self.tensors {
            pos = pos.next_multiple_of(align);
            rel.push(pos);
            pos += t.data.len() as u64;
        }
        for (t, &r) in self.tensors.iter().zip(&rel) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty_id.to_le_bytes());
            out.extend_from_slice(&t.offset.unwrap_or(r).to_le_bytes());
        }
        let data_offset = (out.len() as u64).next_multiple_of(align);
        out.resize(data_offset as usize, 0);
        let mut placed = Vec::new();
        for (t, &r) in self.tensors.iter().zip(&rel) {
            out.resize((data_offset + r) as usize, 0);
            placed.push(data_offset + r);
            out.extend_from_slice(&t.data);
        }
        Built {
            bytes: out,
            data_offset,
            placed,
        }
    }
}

/// Deterministic filler bytes.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    let mut x = u32::from(seed)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(12345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Metadata of every value type, including nested arrays and strings.
pub fn every_value_type() -> Vec<(String, Value)> {
    let s = |x: &str| Value::String(x.to_owned());
    vec![
        ("general.architecture".to_owned(), s("testarch")),
        ("t.u8".to_owned(), Value::U8(200)),
        ("t.i8".to_owned(), Value::I8(-100)),
        ("t.u16".to_owned(), Value::U16(60000)),
        ("t.i16".to_owned(), Value::I16(-30000)),
        ("t.u32".to_owned(), Value::U32(4_000_000_000)),
        ("t.i32".to_owned(), Value::I32(-2_000_000_000)),
        ("t.f32".to_owned(), Value::F32(1.5e-3)),
        ("t.bool".to_owned(), Value::Bool(true)),
        ("t.string".to_owned(), s("héllo wörld ✓")),
        ("t.empty_string".to_owned(), s("")),
        ("t.u64".to_owned(), Value::U64(u64::MAX - 7)),
        ("t.i64".to_owned(), Value::I64(i64::MIN + 3)),
        ("t.f64".to_owned(), Value::F64(-2.25e100)),
        (
            "t.array_u32".to_owned(),
            Value::Array(vec![Value::U32(1), Value::U32(2), Value::U32(3)]),
        ),
        (
            "t.array_str".to_owned(),
            Value::Array(vec![s("<s>"), s(""), s("▁tok")]),
        ),
        ("t.array_empty".to_owned(), Value::Array(vec![])),
        (
            "t.array_nested".to_owned(),
            Value::Array(vec![
                Value::Array(vec![Value::I16(-1), Value::I16(2)]),
                Value::Array(vec![Value::I16(3)]),
            ]),
        ),
        (
            "t.array_bool".to_owned(),
            Value::Array(vec![Value::Bool(false), Value::Bool(true)]),
        ),
        (
            "t.array_f64".to_owned(),
            Value::Array(vec![Value::F64(0.5), Value::F64(-0.0)]),
        ),
    ]
}

/// GGML type ids used by the tests.
pub mod ty {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const BF16: u32 = 30;
}

/// The norm-like F32 values of the small valid file's first tensor.
pub const NORM: [f32; 12] = [
    1.0, -2.0, 0.5, 3.25, 0.0, -0.125, 7.0, 1e-6, -1e6, 2.5, 9.0, -4.0,
];

/// A small valid file: every value type and tensors of several types and
/// shapes, the last one ending exactly at the end of the file.
pub fn small_valid() -> GgufBuilder {
    let b = GgufBuilder {
        kvs: every_value_type(),
        ..GgufBuilder::default()
    };
    let f16: Vec<u8> = [
        0x3c00u16, 0xc000, 0x3555, 0x0001, 0x7bff, 0x0000, 0x8000, 0x4200,
    ]
    .iter()
    .flat_map(|h| h.to_le_bytes())
    .collect();
    let bf16: Vec<u8> = [1.0f32, -3.5, 0.15625, 256.0]
        .iter()
        .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    b.tensor(TensorSpec::new(
        "norm.weight",
        &[4, 3],
        ty::F32,
        f32_bytes(&NORM),
    ))
    .tensor(TensorSpec::new("half.weight", &[8], ty::F16, f16))
    .tensor(TensorSpec::new("bf.weight", &[2, 2], ty::BF16, bf16))
    .tensor(TensorSpec::new(
        "q8.weight",
        &[64, 2],
        ty::Q8_0,
        pattern(136, 1),
    ))
    .tensor(TensorSpec::new(
        "q41.weight",
        &[32, 1, 1, 3],
        ty::Q4_1,
        pattern(60, 2),
    ))
    .tensor(TensorSpec::new(
        "q4k.weight",
        &[256],
        ty::Q4_K,
        pattern(144, 3),
    ))
}
