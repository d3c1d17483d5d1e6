//! Metadata values as a GGUF file stores them, and typed look-ups that say
//! which key was missing or mistyped.

use crate::error::{EngineError, Result};
use std::collections::BTreeMap;

/// One metadata value (GGUF value types 0..=12).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, when it is an integer type and fits.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, when it is an integer type and fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a float (any numeric type).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The metadata of a file, by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pub entries: BTreeMap<String, Value>,
}

fn missing(key: &str, want: &str) -> EngineError {
    EngineError::Model(format!("metadata {key:?}: expected {want}, missing"))
}

fn mistyped(key: &str, want: &str, got: &Value) -> EngineError {
    let got = match got {
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::String(s) => format!("the string {:?}", s.chars().take(40).collect::<String>()),
        other => format!("{other:?}"),
    };
    EngineError::Model(format!("metadata {key:?}: expected {want}, got {got}"))
}

impl Metadata {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self
            .get(key)
            .ok_or_else(|| missing(key, "an unsigned integer"))?;
        v.as_u64()
            .ok_or_else(|| mistyped(key, "an unsigned integer", v))
    }

    /// A count or size that must fit `usize`.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.u64(key)?;
        usize::try_from(v)
            .map_err(|_| EngineError::Model(format!("metadata {key:?}: {v} does not fit")))
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        let v = self.get(key).ok_or_else(|| missing(key, "a number"))?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| mistyped(key, "a number", v))
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.get(key).ok_or_else(|| missing(key, "a string"))?;
        v.as_str().ok_or_else(|| mistyped(key, "a string", v))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        let v = self.get(key).ok_or_else(|| missing(key, "a bool"))?;
        v.as_bool().ok_or_else(|| mistyped(key, "a bool", v))
    }

    pub fn array(&self, key: &str) -> Result<&[Value]> {
        let v = self.get(key).ok_or_else(|| missing(key, "an array"))?;
        v.as_array().ok_or_else(|| mistyped(key, "an array", v))
    }

    /// An optional key: `Ok(None)` when absent, an error when present with the wrong type.
    pub fn opt<T>(&self, key: &str, f: impl Fn(&Self, &str) -> Result<T>) -> Result<Option<T>> {
        if self.get(key).is_some() {
            f(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}
