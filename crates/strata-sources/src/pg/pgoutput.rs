//! A decoder for pgoutput protocol version 1 messages (the ones inside XLogData).
//!
//! Begin, Commit and logical decoding Messages are decoded by pgwire-replication into its own
//! events; this module decodes the rest: Relation, Type, Origin, Insert, Update, Delete and
//! Truncate, with tuple data in text or binary form and the `'u'` marker of unchanged TOASTed
//! values.

/// One column of a Relation message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RelColumn {
    /// Part of the replica identity (with REPLICA IDENTITY FULL: every column).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
}

/// A Relation message: the table's columns as the publisher sends them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<RelColumn>,
}

/// One column of a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TupleValue<'a> {
    Null,
    /// An unchanged TOASTed value that was not sent.
    Unchanged,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

/// A decoded message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    Relation(Relation),
    /// Type messages (non-built-in types); strata looks types up in the catalog instead.
    Type,
    Origin,
    Insert {
        rel: u32,
        new: Vec<TupleValue<'a>>,
    },
    Update {
        rel: u32,
        /// `K` (old key, when the key changed) or `O` (old row, REPLICA IDENTITY FULL).
        old: Option<(u8, Vec<TupleValue<'a>>)>,
        new: Vec<TupleValue<'a>>,
    },
    Delete {
        rel: u32,
        kind: u8,
        old: Vec<TupleValue<'a>>,
    },
    Truncate {
        rels: Vec<u32>,
    },
    Begin,
    Commit,
    /// A logical decoding message (`pg_logical_emit_message`).
    Logical,
    /// Messages of later protocol versions (streaming, two-phase): not requested, so never
    /// expected.
    Other(u8),
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "pgoutput message truncated (wanted {n} bytes at offset {})",
                    self.pos
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(self.i32()? as u32)
    }
    fn cstr(&mut self) -> Result<String, String> {
        let rest = &self.buf[self.pos..];
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or("pgoutput string without terminator")?;
        let s = String::from_utf8_lossy(&rest[..end]).into_owned();
        self.pos += end + 1;
        Ok(s)
    }
    fn tuple(&mut self) -> Result<Vec<TupleValue<'a>>, String> {
        let n = self.i16()?;
        if n < 0 {
            return Err("negative column count in tuple".into());
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len).map_err(|_| "negative value length")?;
                    TupleValue::Text(self.take(len)?)
                }
                b'b' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len).map_err(|_| "negative value length")?;
                    TupleValue::Binary(self.take(len)?)
                }
                k => return Err(format!("unknown tuple value kind {:?}", k as char)),
            });
        }
        Ok(out)
    }
}

/// Decode one pgoutput message.
pub(crate) fn decode(data: &[u8]) -> Result<Message<'_>, String> {
    let mut c = Cursor { buf: data, pos: 0 };
    let tag = c.u8()?;
    Ok(match tag {
        b'R' => {
            let oid = c.u32()?;
            let namespace = c.cstr()?;
            let name = c.cstr()?;
            let replica_identity = c.u8()?;
            let n = c.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n.max(0) {
                let flags = c.u8()?;
                let cname = c.cstr()?;
                let type_oid = c.u32()?;
                let typmod = c.i32()?;
                columns.push(RelColumn {
                    key: flags & 1 != 0,
                    name: cname,
                    type_oid,
                    typmod,
                });
            }
            Message::Relation(Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type,
        b'O' => Message::Origin,
        b'I' => {
            let rel = c.u32()?;
            match c.u8()? {
                b'N' => Message::Insert {
                    rel,
                    new: c.tuple()?,
                },
                k => return Err(format!("Insert: expected 'N', got {:?}", k as char)),
            }
        }
        b'U' => {
            let rel = c.u32()?;
            let mut kind = c.u8()?;
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                old = Some((kind, c.tuple()?));
                kind = c.u8()?;
            }
            if kind != b'N' {
                return Err(format!("Update: expected 'N', got {:?}", kind as char));
            }
            Message::Update {
                rel,
                old,
                new: c.tuple()?,
            }
        }
        b'D' => {
            let rel = c.u32()?;
            let kind = c.u8()?;
            if kind != b'K' && kind != b'O' {
                return Err(format!(
                    "Delete: expected 'K' or 'O', got {:?}",
                    kind as char
                ));
            }
            Message::Delete {
                rel,
                kind,
                old: c.tuple()?,
            }
        }
        b'T' => {
            let n = c.i32()?;
            let _options = c.u8()?;
            let mut rels = Vec::with_capacity(n.clamp(0, 1024) as usize);
            for _ in 0..n.max(0) {
                rels.push(c.u32()?);
            }
            Message::Truncate { rels }
        }
        b'B' => Message::Begin,
        b'C' => Message::Commit,
        b'M' => Message::Logical,
        other => Message::Other(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_bytes() -> Vec<u8> {
        let mut v = vec![b'R'];
        v.extend(16384u32.to_be_bytes());
        v.extend(b"public\0t\0");
        v.push(b'd');
        v.extend(2i16.to_be_bytes());
        v.push(1);
        v.extend(b"id\0");
        v.extend(23u32.to_be_bytes());
        v.extend((-1i32).to_be_bytes());
        v.push(0);
        v.extend(b"body\0");
        v.extend(25u32.to_be_bytes());
        v.extend((-1i32).to_be_bytes());
        v
    }

    #[test]
    fn relation_and_update_with_unchanged_toast() {
        let Message::Relation(r) = decode(&relation_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(r.name, "t");
        assert_eq!(r.columns.len(), 2);
        assert!(r.columns[0].key && !r.columns[1].key);

        let mut v = vec![b'U'];
        v.extend(16384u32.to_be_bytes());
        v.push(b'N');
        v.extend(2i16.to_be_bytes());
        v.push(b'b');
        v.extend(4i32.to_be_bytes());
        v.extend(7i32.to_be_bytes());
        v.push(b'u');
        let m = decode(&v).unwrap();
        assert_eq!(
            m,
            Message::Update {
                rel: 16384,
                old: None,
                new: vec![
                    TupleValue::Binary(&7i32.to_be_bytes()),
                    TupleValue::Unchanged
                ]
            }
        );
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let full = relation_bytes();
        for n in 0..full.len() {
            assert!(decode(&full[..n]).is_err(), "prefix {n}");
        }
        assert!(decode(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode(&[b'D', 0, 0, 0, 1, b'X']).is_err());
        assert_eq!(decode(b"S").unwrap(), Message::Other(b'S'));
    }
}
