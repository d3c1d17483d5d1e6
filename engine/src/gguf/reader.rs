//! A bounds-checked little-endian cursor over a file's bytes. Every read
//! names what it was reading and where, so a truncated or hostile file is
//! refused with a message instead of a panic.

use crate::error::{EngineError, Result};

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// The offset of the next byte to read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the cursor.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes; `Format` naming `what` when fewer are left.
    pub(crate) fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let start = self.pos;
        let slice = start
            .checked_add(n)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or_else(|| {
                EngineError::Format(format!(
                    "{} at offset {start}: needs {n} bytes, the file has {} left (truncated)",
                    what(),
                    self.remaining()
                ))
            })?;
        self.pos = start.saturating_add(n);
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i8(&mut self, what: &dyn Fn() -> String) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i16(&mut self, what: &dyn Fn() -> String) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &dyn Fn() -> String) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i64(&mut self, what: &dyn Fn() -> String) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn f32(&mut self, what: &dyn Fn() -> String) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn f64(&mut self, what: &dyn Fn() -> String) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A count read from the file, checked so that `count` items of at least
    /// `min_item_bytes` each fit in what is left: the caller may then reserve
    /// `count` slots without a hostile count forcing a huge allocation.
    pub(crate) fn count(
        &mut self,
        min_item_bytes: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = self.remaining() as u64;
        let fits = n
            .checked_mul(min_item_bytes)
            .is_some_and(|need| need <= left);
        if !fits {
            return Err(EngineError::Format(format!(
                "{} at offset {at}: {n} items of at least {min_item_bytes} bytes each \
                 cannot fit in the {left} bytes left",
                what()
            )));
        }
        usize::try_from(n).map_err(|_| {
            EngineError::Format(format!("{} at offset {at}: {n} does not fit usize", what()))
        })
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        let left = self.remaining();
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                EngineError::Format(format!(
                    "{} at offset {at}: string length {len} exceeds the {left} bytes left",
                    what()
                ))
            })?;
        let raw = self.take(n, what)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(EngineError::Format(format!(
                "{} at offset {at}: string of {n} bytes is not UTF-8 ({e})",
                what()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> String {
        "field".to_owned()
    }

    #[test]
    fn reads_are_bounded_and_named() {
        let bytes = [1u8, 0, 0, 0, 9];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u32(&w).ok(), Some(1));
        assert_eq!(r.remaining(), 1);
        let e = r.u32(&w).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("field at offset 4"), "{e}");
        // A failed read does not move the cursor.
        assert_eq!(r.pos(), 4);
        assert_eq!(r.u8(&w).ok(), Some(9));
    }

    #[test]
    fn hostile_counts_and_lengths_are_refused() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        assert!(matches!(
            Reader::new(&bytes).count(1, &w),
            Err(EngineError::Format(_))
        ));
        assert!(matches!(
            Reader::new(&bytes).string(&w),
            Err(EngineError::Format(_))
        ));
        let mut ok = 2u64.to_le_bytes().to_vec();
        ok.extend_from_slice(b"hi");
        assert_eq!(Reader::new(&ok).string(&w).ok().as_deref(), Some("hi"));
        let mut bad = 2u64.to_le_bytes().to_vec();
        bad.extend_from_slice(&[0xff, 0xfe]);
        let e = Reader::new(&bad).string(&w).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("not UTF-8")));
    }
}
