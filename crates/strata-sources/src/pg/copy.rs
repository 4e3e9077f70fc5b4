//! PostgreSQL's binary COPY format (`COPY ... TO STDOUT (FORMAT binary)`), parsed row by
//! row straight from the stream's buffers: no per-row objects, each field handed on as the
//! bytes of its binary send format (the same bytes a binary query result carries).
//!
//! The stream: the 11-byte signature `PGCOPY\n\xff\r\n\0`, a 32-bit flags word, a 32-bit
//! header extension length and that many bytes; then tuples, each a 16-bit field count and
//! per field a 32-bit length (-1: NULL) followed by that many bytes; a field count of -1
//! ends the data. Integers are big-endian.

use bytes::{Buf, Bytes, BytesMut};

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// One field of a tuple: where its bytes are in the tuple's buffer (`None`: NULL).
pub(crate) type Field = Option<(usize, usize)>;

/// What [`CopyParser::next_tuple`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tuple {
    /// A whole tuple is in the buffer: its fields are in `fields`, their bytes in
    /// [`CopyParser::data`] until [`CopyParser::consume`].
    Row,
    /// More bytes are needed.
    Incomplete,
    /// The trailer: no more tuples.
    End,
}

/// An incremental parser of a binary COPY stream: bytes go in with [`CopyParser::push`],
/// whole tuples come out with [`CopyParser::next_tuple`].
#[derive(Default)]
pub(crate) struct CopyParser {
    /// Bytes received and not consumed yet.
    buf: BytesMut,
    /// A chunk received while `buf` was empty, parsed in place (the usual case: the server
    /// sends one tuple per message); what is left of it moves into `buf` on the next push.
    chunk: Bytes,
    header_done: bool,
    /// The length of the tuple found last (consumed by [`CopyParser::consume`]).
    pending: usize,
    /// The fields of the tuple found last.
    pub fields: Vec<Field>,
}

impl CopyParser {
    /// Adds bytes from the stream.
    pub fn push(&mut self, data: Bytes) {
        if self.buf.is_empty() && self.chunk.is_empty() {
            self.chunk = data;
        } else {
            if !self.chunk.is_empty() {
                self.buf.extend_from_slice(&self.chunk);
                self.chunk = Bytes::new();
            }
            self.buf.extend_from_slice(&data);
        }
    }

    /// The bytes the fields of the last tuple found point into.
    pub fn data(&self) -> &[u8] {
        if self.chunk.is_empty() {
            &self.buf
        } else {
            &self.chunk
        }
    }

    /// Drops the last tuple found, once its fields were read.
    pub fn consume(&mut self) {
        let n = std::mem::take(&mut self.pending);
        if self.chunk.is_empty() {
            self.buf.advance(n);
        } else {
            self.chunk.advance(n);
        }
    }

    /// Finds the next whole tuple (its fields in [`CopyParser::fields`]), checking that it has
    /// `width` fields.
    pub fn next_tuple(&mut self, width: usize) -> Result<Tuple, String> {
        if !self.header_done {
            let data = self.data();
            if data.len() < SIGNATURE.len() + 8 {
                return Ok(Tuple::Incomplete);
            }
            if &data[..SIGNATURE.len()] != SIGNATURE {
                return Err("the COPY stream does not start with the binary signature".into());
            }
            let at = SIGNATURE.len() + 4;
            let ext = u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
            let header = at + 4 + ext as usize;
            if data.len() < header {
                return Ok(Tuple::Incomplete);
            }
            self.pending = header;
            self.consume();
            self.header_done = true;
        }
        // Borrowed field by field, so that `fields` can be filled meanwhile.
        let data: &[u8] = if self.chunk.is_empty() {
            &self.buf
        } else {
            &self.chunk
        };
        let Some(count) = data.get(..2) else {
            return Ok(Tuple::Incomplete);
        };
        let count = i16::from_be_bytes([count[0], count[1]]);
        if count == -1 {
            return Ok(Tuple::End);
        }
        if count < 0 || count as usize != width {
            return Err(format!(
                "a COPY tuple has {count} fields where {width} were asked for"
            ));
        }
        self.fields.clear();
        let mut at = 2usize;
        for _ in 0..width {
            let Some(len) = data.get(at..at + 4) else {
                return Ok(Tuple::Incomplete);
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            at += 4;
            if len < 0 {
                self.fields.push(None);
                continue;
            }
            let len = len as usize;
            if data.len() < at + len {
                return Ok(Tuple::Incomplete);
            }
            self.fields.push(Some((at, len)));
            at += len;
        }
        self.pending = at;
        Ok(Tuple::Row)
    }

    /// The bytes of field `i` of the last tuple found (`None`: NULL).
    pub fn field(&self, i: usize) -> Option<&[u8]> {
        self.fields[i].map(|(at, len)| &self.data()[at..at + len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(rows: &[Vec<Option<&[u8]>>]) -> Vec<u8> {
        let mut v = SIGNATURE.to_vec();
        v.extend(0u32.to_be_bytes());
        v.extend(4u32.to_be_bytes());
        v.extend(b"ext!");
        for r in rows {
            v.extend((r.len() as i16).to_be_bytes());
            for f in r {
                match f {
                    None => v.extend((-1i32).to_be_bytes()),
                    Some(b) => {
                        v.extend((b.len() as i32).to_be_bytes());
                        v.extend(*b);
                    }
                }
            }
        }
        v.extend((-1i16).to_be_bytes());
        v
    }

    /// Feeds `bytes` in pieces of `step` and collects every tuple's fields.
    fn parse(bytes: &[u8], step: usize, width: usize) -> Vec<Vec<Option<Vec<u8>>>> {
        let mut p = CopyParser::default();
        let mut out = Vec::new();
        let mut pieces = bytes.chunks(step);
        loop {
            match p.next_tuple(width).unwrap() {
                Tuple::Row => {
                    out.push((0..width).map(|i| p.field(i).map(<[u8]>::to_vec)).collect());
                    p.consume();
                }
                Tuple::Incomplete => p.push(Bytes::copy_from_slice(pieces.next().unwrap())),
                Tuple::End => break,
            }
        }
        assert!(pieces.next().is_none());
        out
    }

    #[test]
    fn tuples_split_anywhere_parse_the_same() {
        let rows = vec![
            vec![Some(&b"abc"[..]), None, Some(&b""[..])],
            vec![None, Some(&[1u8, 2, 3, 4][..]), Some(&b"x"[..])],
        ];
        let bytes = stream(&rows);
        let want: Vec<Vec<Option<Vec<u8>>>> = rows
            .iter()
            .map(|r| r.iter().map(|f| f.map(<[u8]>::to_vec)).collect())
            .collect();
        for step in [1, 2, 3, 5, 7, 19, bytes.len()] {
            assert_eq!(parse(&bytes, step, 3), want, "pieces of {step} bytes");
        }
    }

    #[test]
    fn bad_streams_are_errors() {
        let mut p = CopyParser::default();
        p.push(Bytes::from_static(b"PGCOPY\n\xff\r\n\x01\0\0\0\0\0\0\0\0"));
        assert!(p.next_tuple(1).is_err());
        let bytes = stream(&[vec![Some(&b"a"[..])]]);
        let mut p = CopyParser::default();
        p.push(Bytes::from(bytes));
        assert!(p.next_tuple(2).unwrap_err().contains("1 fields where 2"));
    }
}
