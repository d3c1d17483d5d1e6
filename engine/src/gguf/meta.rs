//! Parsing the metadata section: key/value pairs of GGUF value types 0..=12,
//! arrays (nested to a bounded depth) and strings, every count checked
//! against the bytes left before anything is reserved.

use super::reader::Reader;
use super::value::{Metadata, Value};
use crate::error::{EngineError, Result};
use std::collections::btree_map::Entry;

/// Arrays of arrays nest at most this deep; deeper is refused, so a hostile
/// file cannot drive the recursion into the stack's end.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest encoding of one key/value pair: key length (8), value type (4)
/// and a one-byte value.
pub(crate) const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// Bytes of the smallest encoding of a value of type `ty`: a fixed-size
/// number, a string's length or an array's type and length.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn type_name(ty: u32) -> &'static str {
    match ty {
        0 => "u8",
        1 => "i8",
        2 => "u16",
        3 => "i16",
        4 => "u32",
        5 => "i32",
        6 => "f32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "u64",
        11 => "i64",
        12 => "f64",
        _ => "unknown",
    }
}

fn unknown_type(key: &str, ty: u32, at: usize) -> EngineError {
    EngineError::Format(format!(
        "metadata {key:?} at offset {at}: unknown value type {ty} (expected 0..=12)"
    ))
}

/// Reads `count` key/value pairs.
pub(crate) fn read_metadata(r: &mut Reader<'_>, count: usize) -> Result<Metadata> {
    let mut md = Metadata::default();
    for i in 0..count {
        let key_at = r.pos();
        let key = r.string(&|| format!("metadata key {i} of {count}"))?;
        let ty_at = r.pos();
        let ty = r.u32(&|| format!("metadata {key:?} value type"))?;
        let value = read_value(r, &key, ty, ty_at, 0)?;
        match md.entries.entry(key) {
            Entry::Occupied(e) => {
                return Err(EngineError::Format(format!(
                    "metadata {:?} at offset {key_at}: duplicate key",
                    e.key()
                )))
            }
            Entry::Vacant(e) => {
                e.insert(value);
            }
        }
    }
    Ok(md)
}

/// One value of type `ty` (already read, at offset `ty_at`) for `key`.
fn read_value(r: &mut Reader<'_>, key: &str, ty: u32, ty_at: usize, depth: usize) -> Result<Value> {
    let what = || format!("metadata {key:?} {} value", type_name(ty));
    Ok(match ty {
        0 => Value::U8(r.u8(&what)?),
        1 => Value::I8(r.i8(&what)?),
        2 => Value::U16(r.u16(&what)?),
        3 => Value::I16(r.i16(&what)?),
        4 => Value::U32(r.u32(&what)?),
        5 => Value::I32(r.i32(&what)?),
        6 => Value::F32(r.f32(&what)?),
        7 => {
            let at = r.pos();
            match r.u8(&what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(EngineError::Format(format!(
                        "metadata {key:?} at offset {at}: bool byte {b} (expected 0 or 1)"
                    )))
                }
            }
        }
        8 => Value::String(r.string(&what)?),
        9 => read_array(r, key, depth)?,
        10 => Value::U64(r.u64(&what)?),
        11 => Value::I64(r.i64(&what)?),
        12 => Value::F64(r.f64(&what)?),
        other => return Err(unknown_type(key, other, ty_at)),
    })
}

/// An array: element type (u32), count (u64), then the elements.
fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<Value> {
    let at = r.pos();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(EngineError::Format(format!(
            "metadata {key:?} at offset {at}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
        )));
    }
    let elem_ty = r.u32(&|| format!("metadata {key:?} array element type"))?;
    let min = min_value_bytes(elem_ty).ok_or_else(|| unknown_type(key, elem_ty, at))?;
    let n = r.count(min, &|| {
        format!(
            "metadata {key:?} array length ({} elements)",
            type_name(elem_ty)
        )
    })?;
    // `count` has checked that n elements fit in the bytes left.
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        items.push(read_value(r, key, elem_ty, at, depth + 1)?);
    }
    Ok(Value::Array(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, ty: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(payload);
        b
    }

    fn parse(bytes: &[u8], n: usize) -> Result<Metadata> {
        read_metadata(&mut Reader::new(bytes), n)
    }

    #[test]
    fn nested_arrays_parse_up_to_the_depth_bound() {
        // depth-deep nesting of arrays around one u8.
        let nest = |depth: usize| {
            let mut inner = vec![7u8];
            let mut ty = 0u32;
            for _ in 0..depth {
                let mut a = ty.to_le_bytes().to_vec();
                a.extend_from_slice(&1u64.to_le_bytes());
                a.extend_from_slice(&inner);
                inner = a;
                ty = 9;
            }
            kv("k", ty, &inner)
        };
        let ok = parse(&nest(MAX_ARRAY_DEPTH), 1);
        assert!(ok.is_ok(), "{ok:?}");
        let deep = parse(&nest(MAX_ARRAY_DEPTH + 1), 1);
        assert!(
            matches!(&deep, Err(EngineError::Format(m)) if m.contains("nested")),
            "{deep:?}"
        );
    }

    #[test]
    fn bad_bool_duplicate_key_and_unknown_type_are_format_errors() {
        assert!(matches!(
            parse(&kv("b", 7, &[2]), 1),
            Err(EngineError::Format(_))
        ));
        let mut two = kv("a", 0, &[1]);
        two.extend(kv("a", 0, &[2]));
        let dup = parse(&two, 2);
        assert!(matches!(&dup, Err(EngineError::Format(m)) if m.contains("duplicate")));
        let unk = parse(&kv("u", 13, &[0; 8]), 1);
        assert!(matches!(&unk, Err(EngineError::Format(m)) if m.contains("unknown value type 13")));
    }
}
