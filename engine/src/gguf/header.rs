//! The GGUF header and tensor table: magic, version, counts, metadata,
//! tensor infos and the data section's start, all checked against the
//! length of the bytes given.

use super::meta::{read_metadata, MIN_KV_BYTES};
use super::reader::Reader;
use super::value::{Metadata, Value};
use crate::error::{EngineError, Result};
use crate::ggml_type::GgmlType;
use std::collections::HashSet;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Tensors have at most this many dimensions.
pub const MAX_DIMS: usize = 4;
/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Smallest encoding of one tensor info: name length (8), n_dims (4), one
/// dimension (8), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's entry in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the row length (ne0).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute file offset of its data.
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    /// Number of values (the product of the dimensions; checked at parse).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Number of rows: the product of `dims[1..]`.
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// The row length (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// The byte range of its data in the file.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.nbytes)
    }
}

/// A parsed header: everything but the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section (a multiple of `alignment`).
    pub data_offset: u64,
}

fn format_err(msg: String) -> EngineError {
    EngineError::Format(msg)
}

/// An error's message without its variant name.
fn message(e: &EngineError) -> String {
    match e {
        EngineError::Io(m)
        | EngineError::Format(m)
        | EngineError::Unsupported(m)
        | EngineError::Model(m)
        | EngineError::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}

fn read_version(r: &mut Reader<'_>) -> Result<u32> {
    let version = r.u32(&|| "GGUF version".to_owned())?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(EngineError::Unsupported(
            "GGUF version 1 at offset 4 (32-bit counts): expected version 2 or 3".to_owned(),
        )),
        v if matches!(v.swap_bytes(), 1..=3) => Err(EngineError::Unsupported(format!(
            "GGUF version {v:#010x} at offset 4 reads as {} byte-swapped: a big-endian file; \
             only little-endian GGUF is supported",
            v.swap_bytes()
        ))),
        v => Err(EngineError::Unsupported(format!(
            "GGUF version {v} at offset 4: expected version 2 or 3"
        ))),
    }
}

fn alignment_of(md: &Metadata) -> Result<u64> {
    let key = "general.alignment";
    let a = match md.get(key) {
        None => return Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) => u64::from(*a),
        Some(other) => {
            return Err(format_err(format!(
                "metadata {key:?}: expected a u32, got {other:?}"
            )))
        }
    };
    if !a.is_power_of_two() {
        return Err(format_err(format!(
            "metadata {key:?}: {a} is not a nonzero power of two"
        )));
    }
    Ok(a)
}

/// One tensor info; `offset` is still relative to the data section.
fn read_tensor_info(r: &mut Reader<'_>, i: usize, count: usize) -> Result<TensorInfo> {
    let at = r.pos();
    let name = r.string(&|| format!("tensor name {i} of {count}"))?;
    let nd_at = r.pos();
    let n_dims = r.u32(&|| format!("tensor {name:?} n_dims"))?;
    let n = usize::try_from(n_dims)
        .ok()
        .filter(|n| (1..=MAX_DIMS).contains(n))
        .ok_or_else(|| {
            format_err(format!(
                "tensor {name:?} at offset {nd_at}: n_dims {n_dims} (expected 1..={MAX_DIMS})"
            ))
        })?;
    let mut dims = Vec::with_capacity(n);
    for d in 0..n {
        let d_at = r.pos();
        let v = r.u64(&|| format!("tensor {name:?} dimension {d}"))?;
        if v == 0 {
            return Err(format_err(format!(
                "tensor {name:?} at offset {d_at}: dimension {d} is 0"
            )));
        }
        dims.push(v);
    }
    let ty_at = r.pos();
    let ty_id = r.u32(&|| format!("tensor {name:?} type"))?;
    let ty = GgmlType::from_id(ty_id).map_err(|e| match e {
        EngineError::Unsupported(m) => {
            EngineError::Unsupported(format!("tensor {name:?} at offset {ty_at}: {m}"))
        }
        other => other,
    })?;
    let offset = r.u64(&|| format!("tensor {name:?} data offset"))?;
    let mut elements = 1u64;
    for &d in &dims {
        elements = elements.checked_mul(d).ok_or_else(|| {
            format_err(format!(
                "tensor {name:?} at offset {at}: dimensions {dims:?} overflow the element count"
            ))
        })?;
    }
    let row_len = dims.first().copied().unwrap_or(1);
    let row_bytes = ty
        .row_bytes(row_len)
        .map_err(|e| format_err(format!("tensor {name:?} at offset {at}: {}", message(&e))))?;
    let rows = elements / row_len;
    let nbytes = row_bytes.checked_mul(rows).ok_or_else(|| {
        format_err(format!(
            "tensor {name:?} at offset {at}: {} size of dimensions {dims:?} overflows",
            ty.name()
        ))
    })?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        nbytes,
    })
}

/// Makes each tensor's offset absolute and checks it is aligned, inside the
/// file and overlaps no other tensor; refuses duplicate names.
fn place_tensors(
    tensors: &mut [TensorInfo],
    data_offset: u64,
    alignment: u64,
    len: u64,
) -> Result<()> {
    let mut names: HashSet<&str> = HashSet::with_capacity(tensors.len());
    for t in tensors.iter_mut() {
        let rel = t.offset;
        if !rel.is_multiple_of(alignment) {
            return Err(format_err(format!(
                "tensor {:?}: data offset {rel} is not a multiple of the alignment {alignment}",
                t.name
            )));
        }
        let start = data_offset.checked_add(rel);
        let end = start.and_then(|s| s.checked_add(t.nbytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= len => t.offset = s,
            _ => {
                return Err(format_err(format!(
                    "tensor {:?}: data at offset {data_offset} + {rel}, {} bytes, ends past the \
                     end of the {len}-byte file",
                    t.name, t.nbytes
                )))
            }
        }
    }
    for t in tensors.iter() {
        if !names.insert(t.name.as_str()) {
            return Err(format_err(format!(
                "tensor {:?} at data offset {}: duplicate tensor name",
                t.name, t.offset
            )));
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.nbytes));
    for pair in order.windows(2) {
        if let [a, b] = pair {
            if b.offset < a.offset.saturating_add(a.nbytes) {
                return Err(format_err(format!(
                    "tensors {:?} (offset {}, {} bytes) and {:?} (offset {}) overlap",
                    a.name, a.offset, a.nbytes, b.name, b.offset
                )));
            }
        }
    }
    Ok(())
}

/// Parses and checks a GGUF header against `bytes` (the whole file).
pub fn parse_header(bytes: &[u8]) -> Result<Header> {
    let len = bytes.len() as u64;
    let mut r = Reader::new(bytes);
    let magic = r.take(4, &|| "GGUF magic".to_owned())?;
    if magic != MAGIC {
        return Err(format_err(format!(
            "magic at offset 0: expected \"GGUF\" (47 47 55 46), got {magic:02x?}"
        )));
    }
    let version = read_version(&mut r)?;
    let tensor_count = r.u64(&|| "tensor count".to_owned())?;
    // Each entry takes at least MIN_KV_BYTES, so a hostile count fails here.
    let kv_count = r.count(MIN_KV_BYTES, &|| "metadata count".to_owned())?;
    let metadata = read_metadata(&mut r, kv_count)?;
    let alignment = alignment_of(&metadata)?;
    let tc_fits = tensor_count
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .is_some_and(|need| need <= r.remaining() as u64);
    let tensor_count = usize::try_from(tensor_count)
        .ok()
        .filter(|_| tc_fits)
        .ok_or_else(|| {
            format_err(format!(
                "tensor count at offset 8: {tensor_count} tensor infos cannot fit in the {} bytes \
                 left after the metadata (offset {})",
                r.remaining(),
                r.pos()
            ))
        })?;
    let mut tensors = Vec::with_capacity(tensor_count);
    for i in 0..tensor_count {
        tensors.push(read_tensor_info(&mut r, i, tensor_count)?);
    }
    let infos_end = r.pos() as u64;
    let data_offset = infos_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| format_err(format!("data section after offset {infos_end} overflows")))?;
    if !tensors.is_empty() && data_offset > len {
        return Err(format_err(format!(
            "data section at offset {data_offset} (tensor infos end at {infos_end}, alignment \
             {alignment}) starts past the end of the {len}-byte file"
        )));
    }
    place_tensors(&mut tensors, data_offset, alignment, len)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
