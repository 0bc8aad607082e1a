//! Reads the fields of a template off the front of its bytes.
//!
//! Every read names the [`Field`] it is for, so running out of bytes or meeting a malformed
//! LEB128 says where. Nothing indexes past the end: reads go through `get`, and `pos` never
//! exceeds the input's length.

use super::error::{Field, TemplateFormatError};
use super::CHECKSUM_BYTES;

/// Longest LEB128 encoding of a u64: 9 groups of 7 bits, and a tenth byte holding bit 63.
pub(super) const MAX_LEB128_BYTES: usize = 10;

pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    /// Bytes before this were read; at most `bytes.len()`.
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    /// Offset of the next unread byte.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    /// The bytes read so far.
    pub(super) fn consumed(&self) -> &'a [u8] {
        self.bytes.get(..self.pos).unwrap_or(self.bytes)
    }

    /// The next `n` bytes.
    pub(super) fn take(&mut self, n: u64, field: Field) -> Result<&'a [u8], TemplateFormatError> {
        let past_end = || TemplateFormatError::FieldPastEnd {
            field,
            offset: self.pos,
            needed: n,
            input_len: self.bytes.len(),
        };
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .ok_or_else(past_end)?;
        let taken = self.bytes.get(self.pos..end).ok_or_else(past_end)?;
        self.pos = end;
        Ok(taken)
    }

    /// The next `N` bytes, as an array.
    pub(super) fn array<const N: usize>(
        &mut self,
        field: Field,
    ) -> Result<[u8; N], TemplateFormatError> {
        let taken = self.take(N as u64, field)?;
        Ok(taken
            .try_into()
            .expect("take returns exactly the bytes asked for"))
    }

    pub(super) fn u16(&mut self, field: Field) -> Result<u16, TemplateFormatError> {
        self.array(field).map(u16::from_le_bytes)
    }

    /// An unsigned LEB128 integer: at most [`MAX_LEB128_BYTES`] bytes, and the last of ten
    /// may only hold bit 63.
    pub(super) fn uleb(&mut self, field: Field) -> Result<u64, TemplateFormatError> {
        let offset = self.pos;
        let mut value = 0u64;
        for i in 0..MAX_LEB128_BYTES {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(TemplateFormatError::Truncated {
                    field,
                    offset,
                    input_len: self.bytes.len(),
                });
            };
            self.pos += 1;
            let low = u64::from(byte & 0x7f);
            if i == MAX_LEB128_BYTES - 1 && low > 1 {
                return Err(TemplateFormatError::LebOverflow { field, offset });
            }
            value |= low << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(TemplateFormatError::LebTooLong {
            field,
            offset,
            max_bytes: MAX_LEB128_BYTES,
        })
    }

    /// A count of entries of at least `min_entry_bytes` each, refused when the bytes left
    /// (less the checksum) cannot hold that many, so a hostile count never sizes an
    /// allocation.
    pub(super) fn count(
        &mut self,
        field: Field,
        min_entry_bytes: usize,
    ) -> Result<usize, TemplateFormatError> {
        let offset = self.pos;
        let count = self.uleb(field)?;
        let room = self.remaining().saturating_sub(CHECKSUM_BYTES) / min_entry_bytes.max(1);
        match usize::try_from(count) {
            Ok(count) if count <= room => Ok(count),
            _ => Err(TemplateFormatError::CountTooLarge {
                field,
                offset,
                count,
                bytes_left: self.remaining(),
                min_entry_bytes,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_refuses_more_than_is_left_and_stays_put() {
        let mut cur = Cursor::new(b"abcd");
        assert_eq!(cur.take(3, Field::Spec).unwrap(), b"abc");
        let err = cur.take(u64::MAX, Field::Spec).unwrap_err();
        assert_eq!(
            err,
            TemplateFormatError::FieldPastEnd {
                field: Field::Spec,
                offset: 3,
                needed: u64::MAX,
                input_len: 4
            }
        );
        assert_eq!(cur.pos(), 3);
        assert_eq!(cur.consumed(), b"abc");
    }

    #[test]
    fn uleb_reads_the_largest_u64_and_names_where_it_started() {
        let mut bytes = vec![0x05];
        bytes.extend_from_slice(&[0xff; 9]);
        bytes.push(0x01);
        let mut cur = Cursor::new(&bytes);
        assert_eq!(cur.uleb(Field::FileCount).unwrap(), 5);
        assert_eq!(cur.uleb(Field::FileCount).unwrap(), u64::MAX);
        let mut cut = Cursor::new(&[0x01, 0x80, 0x80]);
        cut.uleb(Field::SpecLen).unwrap();
        assert_eq!(
            cut.uleb(Field::SpecLen),
            Err(TemplateFormatError::Truncated {
                field: Field::SpecLen,
                offset: 1,
                input_len: 3
            })
        );
    }
}
