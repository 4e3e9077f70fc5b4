//! MySQL / MariaDB log-based CDC from the binary log (row format, full row images), for
//! triggered runs: a consistent snapshot of the tables with the binlog position it
//! corresponds to, then bounded reads of the transactions committed after a position, up
//! to a fence (the end of the binlog when the read began).
//!
//! Positions are binlog file + offset, encoded as an [`Lsn`] that keeps their order:
//! `file number << 32 | offset` (`binlog.000012` at offset 4567 is `C/11D7`), so the engine
//! records and compares them as it does PostgreSQL's LSNs. A change row's `_commit_lsn` is
//! the position right after its transaction's commit event (the position the next read
//! starts from), `_change_seq` its place in the transaction; snapshot rows carry the
//! snapshot's position. The rows of one transaction are held in memory until its commit
//! event arrives (the binlog says where a transaction ends only there).
//!
//! The server must log row images: `log_bin` on, `binlog_format = ROW`,
//! `binlog_row_image = FULL` ([`check_settings`]); the user needs `REPLICATION SLAVE`,
//! `REPLICATION CLIENT` and `SELECT` (and `RELOAD` on MySQL, whose snapshot takes a brief
//! global read lock). Nothing is kept on the server between runs: unlike a replication slot,
//! the binlog is not retained for strata, so a position whose file the server purged
//! (`binlog_expire_logs_seconds`, `expire_logs_days`, `PURGE BINARY LOGS`) is lost, and
//! only a new snapshot (a full refresh) recovers.
//!
//! Columns added to a table (`ALTER TABLE ... ADD COLUMN`) are followed: see the `alter`
//! module and [`BinlogChanges`]; other changes to a table's columns stop the read.

use std::collections::{BTreeMap, HashMap, VecDeque};

use arrow_array::RecordBatch;
use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Value};

use crate::batch::{meta, Cell, ChangeBuffer, ColumnKind, SourceSchema};
use crate::conn::{ConnectionSpec, Resolved};
use crate::error::{Result, SourceError};
use crate::lsn::Lsn;
use crate::mysql::{self, MyDecode};
use crate::object::{mysql_ident, SourceObject, TableRef};
use crate::pg::cdc::{CdcConfig, CdcTable, ChangeSummary, CopyPosition, ReadOptions, TableBatch};
use crate::value::Watermark;

mod alter;

use alter::ColumnChange;

// --- positions -------------------------------------------------------------------------------

/// The number in a binlog file's name (`binlog.000012` -> 12).
pub fn file_number(name: &str) -> Option<u32> {
    let (_, n) = name.rsplit_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// A binlog position as an order-preserving [`Lsn`]: `file number << 32 | offset`.
pub fn position_lsn(file: &str, offset: u64) -> Option<Lsn> {
    let n = file_number(file)?;
    let offset = u32::try_from(offset).ok()?;
    Some(Lsn(((n as u64) << 32) | offset as u64))
}

/// The file number and offset an [`Lsn`] of [`position_lsn`] stands for.
pub fn lsn_position(lsn: Lsn) -> (u32, u32) {
    ((lsn.0 >> 32) as u32, (lsn.0 & 0xFFFF_FFFF) as u32)
}

/// `binlog file #12, offset 4567`: a position for messages.
pub fn describe_position(lsn: Lsn) -> String {
    let (n, off) = lsn_position(lsn);
    format!("binlog file #{n}, offset {off}")
}

// --- settings --------------------------------------------------------------------------------

/// The server settings binlog CDC needs, as `@@log_bin`, `@@binlog_format`,
/// `@@binlog_row_image` report them; the error names the setting and how to set it.
pub fn check_settings(
    log_bin: Option<&str>,
    format: Option<&str>,
    row_image: Option<&str>,
) -> std::result::Result<(), String> {
    let on = matches!(
        log_bin.map(str::to_ascii_uppercase).as_deref(),
        Some("1" | "ON")
    );
    if !on {
        return Err(
            "the server's binary log is off (log_bin = OFF); binlog CDC needs it: start \
             the server with log-bin (and a server-id), binlog_format=ROW and \
             binlog_row_image=FULL in its option file"
                .into(),
        );
    }
    let format = format.unwrap_or("").to_ascii_uppercase();
    if format != "ROW" {
        return Err(format!(
            "the server has binlog_format = {format}; binlog CDC needs row events: set \
             binlog_format=ROW in the server's option file (or SET GLOBAL binlog_format = 'ROW', \
             which applies to new sessions)"
        ));
    }
    // Servers before binlog_row_image (MySQL 5.5, MariaDB 10.0) always log full rows.
    if let Some(image) = row_image {
        if !image.eq_ignore_ascii_case("FULL") {
            return Err(format!(
                "the server has binlog_row_image = {image}; binlog CDC needs every column of \
                 every changed row: set binlog_row_image=FULL in the server's option file (or \
                 SET GLOBAL binlog_row_image = 'FULL', which applies to new sessions)"
            ));
        }
    }
    Ok(())
}

// --- statements in the binlog ----------------------------------------------------------------

/// A table as a statement names it: its database, when named, and its name.
pub(crate) type TableName = (Option<String>, String);

/// What a statement logged as a query event means for the tables read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Statement {
    /// `BEGIN`: a transaction of row events follows.
    Begin,
    /// `COMMIT` (non-transactional tables end their event group so).
    Commit,
    /// `ROLLBACK` (a group that changed only non-transactional tables and was rolled back).
    Rollback,
    /// `TRUNCATE [TABLE] t`.
    Truncate(Vec<(Option<String>, String)>),
    /// `ALTER TABLE t ...`: the table and what each clause does to its columns.
    Alter((Option<String>, String), Vec<ColumnChange>),
    /// A statement that removes or replaces tables (`DROP`, `RENAME`, `CREATE OR REPLACE`):
    /// the verb and the tables it names.
    Ddl(String, Vec<(Option<String>, String)>),
    /// Anything else (other DDL, a dummy event in place of a MariaDB-only one).
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    /// A string literal (`'a,b'`, `"x"`).
    Str(String),
    Punct(char),
}

fn tokens(sql: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for x in chars.by_ref() {
                    if prev == '*' && x == '/' {
                        break;
                    }
                    prev = x;
                }
            }
            '#' => {
                for x in chars.by_ref() {
                    if x == '\n' {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for x in chars.by_ref() {
                    if x == '\n' {
                        break;
                    }
                }
            }
            '`' => {
                let mut s = String::new();
                while let Some(x) = chars.next() {
                    if x == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            s.push('`');
                        } else {
                            break;
                        }
                    } else {
                        s.push(x);
                    }
                }
                out.push(Token::Quoted(s));
            }
            '\'' | '"' => {
                let mut s = String::new();
                while let Some(x) = chars.next() {
                    if x == '\\' {
                        s.extend(chars.next());
                    } else if x == c {
                        if chars.peek() == Some(&c) {
                            chars.next();
                            s.push(c);
                        } else {
                            break;
                        }
                    } else {
                        s.push(x);
                    }
                }
                out.push(Token::Str(s));
            }
            c if c.is_alphanumeric() || c == '_' || c == '$' => {
                let mut s = String::from(c);
                while let Some(&x) = chars.peek() {
                    if x.is_alphanumeric() || x == '_' || x == '$' {
                        s.push(x);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Token::Word(s));
            }
            c if c.is_whitespace() => {}
            c => out.push(Token::Punct(c)),
        }
    }
    out
}

impl Token {
    fn keyword(&self, k: &str) -> bool {
        matches!(self, Token::Word(w) if w.eq_ignore_ascii_case(k))
    }
    fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) | Token::Quoted(w) => Some(w),
            Token::Str(_) | Token::Punct(_) => None,
        }
    }
}

/// A table name at `toks[i..]` (`t`, `db.t`): the name and the index after it.
fn table_name(toks: &[Token], i: usize) -> Option<((Option<String>, String), usize)> {
    let first = toks.get(i)?.name()?.to_string();
    if toks.get(i + 1) == Some(&Token::Punct('.')) {
        let second = toks.get(i + 2)?.name()?.to_string();
        return Some(((Some(first), second), i + 3));
    }
    Some(((None, first), i + 1))
}

/// Table names separated by commas from `toks[i..]`.
fn table_list(toks: &[Token], mut i: usize) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    while let Some((t, next)) = table_name(toks, i) {
        out.push(t);
        if toks.get(next) == Some(&Token::Punct(',')) {
            i = next + 1;
        } else {
            break;
        }
    }
    out
}

/// Classifies a statement of a query event.
pub(crate) fn classify(sql: &str) -> Statement {
    let toks = tokens(sql);
    let Some(first) = toks.first() else {
        return Statement::Other;
    };
    let at = |i: usize, k: &str| toks.get(i).is_some_and(|t| t.keyword(k));
    if first.keyword("BEGIN") || (first.keyword("START") && at(1, "TRANSACTION")) {
        return Statement::Begin;
    }
    if first.keyword("COMMIT") || (first.keyword("XA") && at(1, "COMMIT")) {
        return Statement::Commit;
    }
    if first.keyword("ROLLBACK") && !at(1, "TO") {
        return Statement::Rollback;
    }
    if first.keyword("TRUNCATE") {
        let i = if at(1, "TABLE") { 2 } else { 1 };
        return Statement::Truncate(
            table_name(&toks, i)
                .map(|(t, _)| vec![t])
                .unwrap_or_default(),
        );
    }
    if first.keyword("ALTER") {
        return match alter::parse_alter(sql) {
            Some((table, changes)) => Statement::Alter(table, changes),
            None => Statement::Other,
        };
    }
    if first.keyword("DROP") {
        let mut i = 1;
        if at(i, "TEMPORARY") {
            return Statement::Other;
        }
        if at(i, "TABLE") {
            i += 1;
            if at(i, "IF") && at(i + 1, "EXISTS") {
                i += 2;
            }
            return Statement::Ddl("DROP TABLE".into(), table_list(&toks, i));
        }
        return Statement::Other;
    }
    if first.keyword("RENAME") && at(1, "TABLE") {
        // RENAME TABLE a TO b, c TO d: every name, old and new.
        let mut names = Vec::new();
        let mut i = 2;
        while let Some((t, next)) = table_name(&toks, i) {
            names.push(t);
            i = next;
            if at(i, "TO") || toks.get(i) == Some(&Token::Punct(',')) {
                i += 1;
            } else {
                break;
            }
        }
        return Statement::Ddl("RENAME TABLE".into(), names);
    }
    if first.keyword("CREATE") && at(1, "OR") && at(2, "REPLACE") && at(3, "TABLE") {
        return Statement::Ddl(
            "CREATE OR REPLACE TABLE".into(),
            table_name(&toks, 4)
                .map(|(t, _)| vec![t])
                .unwrap_or_default(),
        );
    }
    Statement::Other
}

// --- values ----------------------------------------------------------------------------------

/// How one column of a table's binlog rows is read.
#[derive(Clone, Debug)]
struct BinColumn {
    /// Where it goes in the table's change buffer (`None`: excluded).
    slot: Option<usize>,
    name: String,
    decode: MyDecode,
    /// Bits of an unsigned integer column (8, 16, 24, 32): the binlog may give it signed.
    unsigned_bits: Option<u32>,
    /// A TIMESTAMP column: the binlog holds seconds since the epoch (UTC).
    epoch: bool,
    /// ENUM / SET labels (the binlog holds their numbers), in declaration order.
    labels: Option<(bool, Vec<String>)>,
}

/// Bits of an unsigned integer type by its name (`tinyint unsigned` -> 8).
fn unsigned_bits(source_type: &str) -> Option<u32> {
    let t = source_type.to_ascii_lowercase();
    let base = t.strip_suffix(" unsigned")?;
    match base {
        "tinyint" => Some(8),
        "smallint" => Some(16),
        "mediumint" => Some(24),
        "int" => Some(32),
        _ => None,
    }
}

/// The labels of `enum('a','b')` / `set('x','y')` as information_schema spells the type.
pub(crate) fn enum_labels(column_type: &str) -> Option<(bool, Vec<String>)> {
    let lower = column_type.trim().to_ascii_lowercase();
    let (is_set, rest) = if lower.starts_with("enum(") {
        (false, &column_type.trim()[5..])
    } else if lower.starts_with("set(") {
        (true, &column_type.trim()[4..])
    } else {
        return None;
    };
    let mut labels = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        match chars.next()? {
            '\'' => {
                let mut s = String::new();
                loop {
                    match chars.next()? {
                        '\'' if chars.peek() == Some(&'\'') => {
                            chars.next();
                            s.push('\'');
                        }
                        '\'' => break,
                        '\\' => s.push(chars.next()?),
                        c => s.push(c),
                    }
                }
                labels.push(s);
            }
            ',' | ' ' => {}
            ')' => return Some((is_set, labels)),
            _ => return None,
        }
    }
}

/// Seconds since the epoch, with an optional fraction (`1704067200.250000`), as microseconds.
fn epoch_micros(text: &str) -> std::result::Result<i64, String> {
    let bad = || format!("'{text}' is not a TIMESTAMP of the binlog");
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().map_err(|_| bad())?;
    let mut micros = 0i64;
    if !frac.is_empty() {
        if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        micros = format!("{frac:0<6}").parse().map_err(|_| bad())?;
    }
    Ok(secs * 1_000_000 + micros)
}

impl BinColumn {
    /// One binlog value as a cell of its column.
    fn cell(&self, v: Option<&BinlogValue<'_>>) -> std::result::Result<Cell, String> {
        let v = match v {
            None => return Ok(Cell::Null),
            Some(BinlogValue::Value(v)) => v.clone(),
            Some(j @ BinlogValue::Jsonb(_)) => Value::try_from(j.clone().into_owned())
                .map_err(|e| format!("cannot read a JSON value: {e}"))?,
            Some(BinlogValue::JsonDiff(_)) => {
                return Err(
                    "the binlog holds a partial JSON update; set \
                            binlog_row_value_options='' on the server so that it logs whole values"
                        .into(),
                )
            }
        };
        if v == Value::NULL {
            return Ok(Cell::Null);
        }
        if let Some((is_set, labels)) = &self.labels {
            return label_cell(*is_set, labels, &v);
        }
        match (&v, self.decode) {
            (Value::Bytes(b), MyDecode::DateTime) if self.epoch => {
                let text = std::str::from_utf8(b).map_err(|_| "TIMESTAMP is not text")?;
                return Ok(Cell::Micros(epoch_micros(text)?));
            }
            (Value::Int(s), MyDecode::DateTime) if self.epoch => {
                return Ok(Cell::Micros(s * 1_000_000));
            }
            (Value::Int(i), MyDecode::Int) if *i < 0 => {
                if let Some(bits) = self.unsigned_bits {
                    return Ok(Cell::Int(i + (1i64 << bits)));
                }
            }
            (Value::Int(i), MyDecode::U64Decimal) => return Ok(Cell::Decimal(*i as u64 as i128)),
            _ => {}
        }
        mysql::cell(self.decode, &v)
    }
}

/// An ENUM (1-based index; 0 is the empty string of an invalid value) or a SET (a bit mask,
/// little-endian bytes) as its label(s).
fn label_cell(is_set: bool, labels: &[String], v: &Value) -> std::result::Result<Cell, String> {
    let number: u64 = match v {
        Value::Int(i) => *i as u64,
        Value::UInt(u) => *u,
        Value::Bytes(b) if is_set => b
            .iter()
            .enumerate()
            .fold(0u64, |acc, (i, byte)| acc | ((*byte as u64) << (8 * i))),
        // Already a label (a text read).
        Value::Bytes(b) => {
            return Ok(Cell::Str(
                String::from_utf8(b.clone()).map_err(|_| "value is not valid UTF-8")?,
            ))
        }
        other => return Err(format!("unexpected value {other:?} for an ENUM or SET")),
    };
    if is_set {
        let chosen: Vec<&str> = labels
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 64 && number & (1 << i) != 0)
            .map(|(_, l)| l.as_str())
            .collect();
        return Ok(Cell::Str(chosen.join(",")));
    }
    match number {
        0 => Ok(Cell::Str(String::new())),
        n => labels
            .get(n as usize - 1)
            .map(|l| Cell::Str(l.clone()))
            .ok_or_else(|| format!("ENUM value number {n} is not one of the column's labels")),
    }
}

// --- the control plane -----------------------------------------------------------------------

/// A table's columns as binlog CDC reads them.
#[derive(Clone, Debug)]
struct TableLayout {
    table: TableRef,
    schema: SourceSchema,
    decoders: Vec<MyDecode>,
    /// Every column of the table, in order (binlog rows carry them all).
    columns: Vec<BinColumn>,
    /// Primary key columns (slots in the buffer); empty when the table has none.
    key: Vec<usize>,
    /// Every primary key column is read (none excluded), so `key` is the whole key.
    key_whole: bool,
}

/// MySQL / MariaDB log-based CDC for one connection and its tables.
pub struct BinlogCdc {
    r: Resolved,
    cfg: CdcConfig,
    server_id: u32,
    mariadb: bool,
}

impl std::fmt::Debug for BinlogCdc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinlogCdc")
            .field("spec", &self.r.spec)
            .field("config", &self.cfg)
            .finish()
    }
}

/// The server id the binlog client registers with: derived from the slot name (one per
/// streaming table), in 2^30..2^31 where servers' own ids rarely are.
fn client_server_id(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    (1 << 30) | (h & 0x3FFF_FFFF)
}

impl BinlogCdc {
    /// Connect and check the server's binlog settings ([`check_settings`]).
    pub async fn connect(spec: &ConnectionSpec, cfg: CdcConfig) -> Result<BinlogCdc> {
        let r = Resolved::new(spec)?;
        if cfg.tables.is_empty() {
            return Err(SourceError::Config {
                connection: spec.name.clone(),
                detail: "a CDC source needs at least one table".into(),
            });
        }
        let mut conn = r.mysql_connect().await?;
        let out = Self::settings(&r, &mut conn).await;
        let _ = conn.disconnect().await;
        let mariadb = out?;
        Ok(BinlogCdc {
            server_id: client_server_id(&cfg.slot),
            r,
            cfg: CdcConfig {
                batch_rows: cfg.batch_rows.max(1),
                ..cfg
            },
            mariadb,
        })
    }

    /// Checks the settings; whether the server is MariaDB.
    async fn settings(r: &Resolved, conn: &mut Conn) -> Result<bool> {
        let q = |e: mysql_async::Error| r.query_error("server settings", r.scrub(&e.to_string()));
        let version: Option<String> = conn.query_first("SELECT VERSION()").await.map_err(q)?;
        let (log_bin, format): (Option<String>, Option<String>) = conn
            .query_first(
                "SELECT CAST(@@GLOBAL.log_bin AS CHAR), CAST(@@GLOBAL.binlog_format AS CHAR)",
            )
            .await
            .map_err(q)?
            .unwrap_or_default();
        // Missing on servers that always log full rows.
        let image: Option<String> = conn
            .query_first("SELECT CAST(@@GLOBAL.binlog_row_image AS CHAR)")
            .await
            .ok()
            .flatten();
        check_settings(log_bin.as_deref(), format.as_deref(), image.as_deref()).map_err(
            |detail| SourceError::Config {
                connection: r.name().to_string(),
                detail,
            },
        )?;
        Ok(version.is_some_and(|v| v.contains("MariaDB")))
    }

    /// The config.
    pub fn config(&self) -> &CdcConfig {
        &self.cfg
    }

    fn err(&self, at: Option<Lsn>, detail: impl Into<String>, resnapshot: bool) -> SourceError {
        SourceError::Binlog {
            connection: self.r.name().to_string(),
            position: at.map(describe_position),
            detail: detail.into(),
            resnapshot,
        }
    }

    fn q_err(&self, what: &str, e: mysql_async::Error) -> SourceError {
        self.r.query_error(what, self.r.scrub(&e.to_string()))
    }

    /// A table as the connection's database qualifies it.
    fn qualified(&self, t: &TableRef) -> TableRef {
        TableRef::new(
            t.schema
                .clone()
                .unwrap_or_else(|| self.r.spec.database.clone()),
            t.name.clone(),
        )
    }

    /// The primary key columns of `table`, in key order (empty when it has none).
    pub async fn primary_key(&self, table: &TableRef) -> Result<Vec<String>> {
        let mut conn = self.r.mysql_connect().await?;
        let out = self.primary_key_on(&mut conn, table).await;
        let _ = conn.disconnect().await;
        out
    }

    async fn primary_key_on(&self, conn: &mut Conn, table: &TableRef) -> Result<Vec<String>> {
        let t = self.qualified(table);
        conn.exec(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' \
             ORDER BY ORDINAL_POSITION",
            (t.schema.clone().unwrap_or_default(), t.name.clone()),
        )
        .await
        .map_err(|e| self.q_err(&format!("the primary key of table {t}"), e))
    }

    /// Every column of `t` as the binlog carries it, the kept ones described.
    async fn layout(&self, conn: &mut Conn, t: &CdcTable) -> Result<TableLayout> {
        let table = self.qualified(&t.table);
        let object = SourceObject::Table(table.clone());
        let (schema, decoders, all) =
            mysql::describe(conn, &self.r, &object, &t.exclude_columns).await?;
        crate::read::check_columns(&self.r, &object, &all, &schema, &[], &t.exclude_columns)?;
        let types: Vec<(String, String)> = conn
            .exec(
                "SELECT COLUMN_NAME, CAST(COLUMN_TYPE AS CHAR) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (table.schema.clone().unwrap_or_default(), table.name.clone()),
            )
            .await
            .map_err(|e| self.q_err(&format!("the columns of table {table}"), e))?;
        let columns = all
            .iter()
            .map(|name| {
                let slot = schema.index_of(name);
                let (decode, source_type) = match slot {
                    Some(i) => (decoders[i], schema.columns[i].source_type.clone()),
                    None => (MyDecode::Bytes, String::new()),
                };
                let column_type = types
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.as_str())
                    .unwrap_or("");
                BinColumn {
                    slot,
                    name: name.clone(),
                    decode,
                    unsigned_bits: unsigned_bits(&source_type),
                    epoch: slot.is_some_and(|i| schema.columns[i].kind == ColumnKind::TimestampUtc),
                    labels: enum_labels(column_type),
                }
            })
            .collect();
        let key_names = self.primary_key_on(conn, &table).await?;
        let key: Vec<usize> = key_names
            .iter()
            .filter_map(|k| schema.index_of(k))
            .collect();
        Ok(TableLayout {
            table,
            schema,
            decoders,
            columns,
            key_whole: key.len() == key_names.len(),
            key,
        })
    }

    /// The binlog's current end: the fence of a read, a position the server has written up
    /// to (always between transactions).
    async fn binlog_end(&self, conn: &mut Conn) -> Result<Lsn> {
        let mut row: Option<(String, u64)> = None;
        for sql in ["SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"] {
            match conn.query_first::<mysql_async::Row, _>(sql).await {
                Ok(r) => {
                    row = r.and_then(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)));
                    break;
                }
                Err(e) if sql == "SHOW BINARY LOG STATUS" => {
                    return Err(self.q_err("the binlog position (SHOW MASTER STATUS)", e))
                }
                Err(_) => {}
            }
        }
        let (file, pos) = row.ok_or_else(|| {
            self.err(
                None,
                "the server reports no binlog position (SHOW MASTER STATUS is empty): the \
                 binary log is off, or the user lacks REPLICATION CLIENT (GRANT REPLICATION \
                 CLIENT, REPLICATION SLAVE ON *.* TO the user)",
                false,
            )
        })?;
        position_lsn(&file, pos).ok_or_else(|| {
            self.err(
                None,
                format!("binlog file '{file}' at {pos} is not a position strata can record"),
                false,
            )
        })
    }

    /// The binlog files the server has, by number.
    async fn binlog_files(&self, conn: &mut Conn) -> Result<BTreeMap<u32, String>> {
        let rows: Vec<mysql_async::Row> = conn
            .query("SHOW BINARY LOGS")
            .await
            .map_err(|e| self.q_err("the binlog files (SHOW BINARY LOGS)", e))?;
        Ok(rows
            .into_iter()
            .filter_map(|r| r.get::<String, _>(0))
            .filter_map(|name| Some((file_number(&name)?, name)))
            .collect())
    }

    /// First use: a consistent snapshot of every table and the binlog position it
    /// corresponds to ([`BinlogSnapshot::consistent_point`]); the changes after it are read
    /// from there: nothing lost or doubled. MariaDB tells the position of a consistent
    /// snapshot (`binlog_snapshot_file` / `_position`); MySQL's is taken under a brief
    /// `FLUSH TABLES WITH READ LOCK`.
    ///
    /// The tables from `from` on are read, the first after `from`'s key (a first copy that
    /// stopped resumes this way, in a new snapshot). `keyed`: each table whose primary key
    /// is of integer, decimal, date or datetime columns is read in key order, so that
    /// [`BinlogSnapshot::position`] says where to resume.
    pub async fn start_snapshot(&self, from: &CopyPosition, keyed: bool) -> Result<BinlogSnapshot> {
        let mut conn = self.r.mysql_connect().await?;
        let started = async {
            let (point, micros) = self.begin_snapshot(&mut conn).await?;
            let mut tables = Vec::new();
            for (index, t) in self.cfg.tables.iter().enumerate().skip(from.table) {
                let layout = self.layout(&mut conn, t).await?;
                let order = match keyed {
                    true => copy_order(&layout),
                    false => None,
                };
                tables.push(SnapshotTable {
                    index,
                    layout,
                    order,
                    after: from.after_in(index),
                });
            }
            Ok::<_, SourceError>((point, micros, tables))
        }
        .await;
        let (point, micros, tables) = match started {
            Ok(x) => x,
            Err(e) => {
                let _ = conn.disconnect().await;
                return Err(e);
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let task = SnapshotTask {
            r: self.r.clone(),
            point,
            micros,
            batch_rows: self.cfg.batch_rows,
        };
        tokio::spawn(async move {
            for table in tables {
                if let Err(e) = task.read_table(&mut conn, &table, &tx).await {
                    let _ = tx.send(Err(e)).await;
                    break;
                }
            }
            let _ = conn.query_drop("COMMIT").await;
            let _ = conn.disconnect().await;
        });
        Ok(BinlogSnapshot {
            rx,
            consistent_point: point,
            position: None,
        })
    }

    /// Starts the snapshot transaction on `conn`: its binlog position and time.
    async fn begin_snapshot(&self, conn: &mut Conn) -> Result<(Lsn, i64)> {
        let q = |e| self.q_err("the snapshot", e);
        conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await
            .map_err(q)?;
        let point = if self.mariadb {
            conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                .await
                .map_err(q)?;
            let rows: Vec<(String, String)> = conn
                .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
                .await
                .map_err(q)?;
            let get = |k: &str| {
                rows.iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(k))
                    .map(|(_, v)| v.clone())
            };
            match (get("Binlog_snapshot_file"), get("Binlog_snapshot_position")) {
                (Some(f), Some(p)) => p.parse().ok().and_then(|p| position_lsn(&f, p)),
                _ => None,
            }
            .ok_or_else(|| {
                self.err(
                    None,
                    "MariaDB did not report the snapshot's binlog position",
                    false,
                )
            })?
        } else {
            conn.query_drop("FLUSH TABLES WITH READ LOCK")
                .await
                .map_err(|e| {
                    self.q_err(
                        "the snapshot (FLUSH TABLES WITH READ LOCK; the user needs RELOAD)",
                        e,
                    )
                })?;
            let out = async {
                conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    .await
                    .map_err(q)?;
                self.binlog_end(conn).await
            }
            .await;
            let _ = conn.query_drop("UNLOCK TABLES").await;
            out?
        };
        let micros: Option<i64> = conn
            .query_first("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
            .await
            .map_err(q)?;
        Ok((point, micros.unwrap_or(0)))
    }

    /// Read every change committed before the binlog's end now (the fence), after `after`
    /// (the position the engine recorded: the snapshot's, then each run's
    /// [`ChangeSummary::resume_lsn`]). Nothing on the server moves: the next read starts
    /// where the engine says.
    pub async fn read_changes(&self, after: Lsn, options: ReadOptions) -> Result<BinlogChanges> {
        let mut conn = self.r.mysql_connect().await?;
        let prepared = self.prepare_read(&mut conn, after).await;
        let Prepared {
            fence,
            described_at,
            files,
            layouts,
        } = match prepared {
            Ok(x) => x,
            Err(e) => {
                let _ = conn.disconnect().await;
                return Err(e);
            }
        };
        let wanted: HashMap<(String, String), TableLayout> = layouts
            .into_iter()
            .map(|l| {
                (
                    (
                        l.table.schema.clone().unwrap_or_default(),
                        l.table.name.clone(),
                    ),
                    l,
                )
            })
            .collect();
        let buffers = wanted
            .values()
            .map(|l| {
                let cols: Vec<(String, ColumnKind)> = l
                    .schema
                    .columns
                    .iter()
                    .map(|c| (c.name.clone(), c.kind.clone()))
                    .collect();
                (
                    l.table.clone(),
                    ChangeBuffer::new(&cols, self.cfg.batch_rows),
                )
            })
            .collect();
        let mut reader = BinlogChanges {
            r: self.r.clone(),
            server_id: self.server_id,
            files,
            described_at,
            resolved: false,
            switches: HashMap::new(),
            stream: None,
            options,
            batch_rows: self.cfg.batch_rows,
            fence,
            at: after,
            file_number: lsn_position(after).0,
            wanted,
            buffers,
            key_changes: BTreeMap::new(),
            ready: VecDeque::new(),
            txn: None,
            summary: ChangeSummary {
                resume_lsn: after,
                last_commit_end_lsn: None,
                fence_lsn: fence,
                complete: false,
                transactions: 0,
                rows: 0,
                skipped_transactions: 0,
                added_columns: BTreeMap::new(),
                dropped_columns: BTreeMap::new(),
            },
            done: false,
            part_rows: 0,
            part_end: None,
        };
        if after >= fence {
            // Nothing was written since: no stream.
            let _ = conn.disconnect().await;
            reader.summary.complete = true;
            reader.finish()?;
            return Ok(reader);
        }
        reader.stream = Some(reader.open_stream(conn, after).await?);
        Ok(reader)
    }

    /// The fence, the binlog files (the one to start in checked), and the tables' layouts
    /// with the binlog's end right after they were read.
    async fn prepare_read(&self, conn: &mut Conn, after: Lsn) -> Result<Prepared> {
        let fence = self.binlog_end(conn).await?;
        let files = self.binlog_files(conn).await?;
        let (n, _) = lsn_position(after);
        if !files.contains_key(&n) {
            let oldest = files
                .values()
                .next()
                .cloned()
                .unwrap_or_else(|| "none".into());
            return Err(self.err(
                Some(after),
                format!(
                    "the server no longer has the binlog file of the position strata recorded \
                     (its oldest is {oldest}; purged by binlog_expire_logs_seconds, \
                     expire_logs_days or PURGE BINARY LOGS); the changes since are lost to \
                     strata. Re-snapshot with a full refresh, and keep binlogs longer than the \
                     time between runs"
                ),
                true,
            ));
        }
        let mut layouts = Vec::new();
        for t in &self.cfg.tables {
            layouts.push(self.layout(conn, t).await?);
        }
        let described_at = self.binlog_end(conn).await?;
        Ok(Prepared {
            fence,
            described_at,
            files,
            layouts,
        })
    }
}

/// What a change read starts from.
struct Prepared {
    /// The binlog's end when the read began: it stops there.
    fence: Lsn,
    /// The binlog's end right after the tables' columns were read (an ALTER logged between
    /// the fence and this may or may not be in them).
    described_at: Lsn,
    /// The binlog files, by number.
    files: BTreeMap<u32, String>,
    layouts: Vec<TableLayout>,
}

/// Reads the snapshot's tables on the snapshot's connection.
struct SnapshotTask {
    r: Resolved,
    point: Lsn,
    micros: i64,
    batch_rows: usize,
}

/// A snapshot's batches, each with where the rows sent so far end when its table is read
/// in key order.
type SnapshotBatches = tokio::sync::mpsc::Sender<Result<(TableBatch, Option<CopyPosition>)>>;

/// The primary key of `layout`'s table as a copy in key order sorts it (the slots of its
/// columns), or `None` when it has none, one of its columns is not read, or one is of a
/// type whose order strata does not reproduce (text, with its collations and padding;
/// floats; TIMESTAMP, compared in the session's time zone).
fn copy_order(layout: &TableLayout) -> Option<Vec<usize>> {
    let ordered = layout.key.iter().all(|&i| {
        matches!(
            layout.schema.columns[i].kind,
            ColumnKind::Int8
                | ColumnKind::Int16
                | ColumnKind::Int32
                | ColumnKind::Int64
                | ColumnKind::Decimal { .. }
                | ColumnKind::Date
                | ColumnKind::Timestamp
        )
    });
    (layout.key_whole && !layout.key.is_empty() && ordered).then(|| layout.key.clone())
}

/// A table a snapshot reads: its index among the config's tables, its layout, its key
/// order (slots of the primary key; `None`: read as it comes) and the key to start after.
struct SnapshotTable {
    index: usize,
    layout: TableLayout,
    order: Option<Vec<usize>>,
    after: Option<Watermark>,
}

impl SnapshotTask {
    async fn read_table(
        &self,
        conn: &mut Conn,
        t: &SnapshotTable,
        tx: &SnapshotBatches,
    ) -> Result<()> {
        let layout = &t.layout;
        let table = &layout.table;
        let cols: Vec<String> = layout
            .schema
            .columns
            .iter()
            .map(|c| mysql_ident(&c.name))
            .collect();
        let (order, params) = match &t.order {
            Some(key) => key_order_clause(&layout.schema, key, t.after.as_ref()),
            None => (String::new(), Vec::new()),
        };
        let sql = format!(
            "SELECT {} FROM {}{order}",
            if cols.is_empty() {
                "1".to_string()
            } else {
                cols.join(", ")
            },
            table.mysql_sql()
        );
        let kinds: Vec<(String, ColumnKind)> = layout
            .schema
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.kind.clone()))
            .collect();
        let mut buf = ChangeBuffer::new(&kinds, self.batch_rows);
        let q = |e: mysql_async::Error| {
            self.r
                .query_error(table.to_string(), self.r.scrub(&e.to_string()))
        };
        // The key of the last row read (in key order).
        let mut last: Vec<Cell> = Vec::new();
        let position = |last: &[Cell]| -> Option<CopyPosition> {
            let key = t.order.as_ref()?;
            let values = key
                .iter()
                .zip(last)
                .map(|(&i, c)| mysql::cell_watermark(&layout.schema.columns[i].kind, c))
                .collect::<Option<Vec<_>>>()?;
            Some(CopyPosition {
                table: t.index,
                after: Some(Watermark {
                    columns: key
                        .iter()
                        .map(|&i| layout.schema.columns[i].name.clone())
                        .collect(),
                    values,
                }),
            })
        };
        let mut result = conn
            .exec_iter(sql, mysql_async::Params::Positional(params))
            .await
            .map_err(q)?;
        let mut sent = false;
        while let Some(row) = result.next().await.map_err(q)? {
            last.clear();
            for (i, (_, _, b)) in buf.columns.iter_mut().enumerate() {
                let v = row.as_ref(i).unwrap_or(&Value::NULL);
                let c = mysql::cell(layout.decoders[i], v)
                    .map_err(|d| value_error(&self.r, table, &layout.schema.columns[i].name, d))?;
                b.append_value(&c)
                    .map_err(|d| value_error(&self.r, table, &layout.schema.columns[i].name, d))?;
                if t.order.as_ref().is_some_and(|k| k.contains(&i)) {
                    last.push(c);
                }
            }
            buf.end_row(
                meta::SNAPSHOT,
                self.point.to_i64(),
                0,
                Some(self.micros),
                &[],
            );
            if buf.rows >= self.batch_rows {
                let batch = finish(&mut buf, table)?;
                sent = true;
                let item = (table_batch(table, batch), position(&last));
                if tx.send(Ok(item)).await.is_err() {
                    return Ok(());
                }
            }
        }
        if buf.rows > 0 || !sent {
            let batch = finish(&mut buf, table)?;
            let at = match last.is_empty() {
                true => None,
                false => position(&last),
            };
            let _ = tx.send(Ok((table_batch(table, batch), at))).await;
        }
        Ok(())
    }
}

/// ` WHERE (key) > (?, ...) ORDER BY key` for a copy in key order (`key`: slots of
/// `schema`'s columns), and its parameters.
fn key_order_clause(
    schema: &SourceSchema,
    key: &[usize],
    after: Option<&Watermark>,
) -> (String, Vec<Value>) {
    let cols: Vec<String> = key
        .iter()
        .map(|&i| mysql_ident(&schema.columns[i].name))
        .collect();
    let order = format!(" ORDER BY {}", cols.join(", "));
    match after {
        Some(w) if w.values.len() == key.len() => {
            let placeholders: Vec<String> = key
                .iter()
                .map(|&i| mysql::placeholder(&schema.columns[i].kind))
                .collect();
            (
                format!(
                    " WHERE ({}) > ({}){order}",
                    cols.join(", "),
                    placeholders.join(", ")
                ),
                w.values.iter().map(mysql::param).collect(),
            )
        }
        _ => (order, Vec::new()),
    }
}

fn value_error(r: &Resolved, table: &TableRef, column: &str, detail: String) -> SourceError {
    SourceError::Value {
        connection: r.name().to_string(),
        object: format!("table {table}"),
        column: column.to_string(),
        detail,
    }
}

fn finish(buf: &mut ChangeBuffer, table: &TableRef) -> Result<RecordBatch> {
    buf.finish().map_err(|source| SourceError::Arrow {
        object: table.to_string(),
        source,
    })
}

fn table_batch(table: &TableRef, batch: RecordBatch) -> TableBatch {
    TableBatch {
        table: table.clone(),
        batch,
        added_columns: vec![],
        key_changes: vec![],
    }
}

/// The initial snapshot: every table's rows as of the snapshot's binlog position, as change
/// rows with `_change_type = 'snapshot'`, `_commit_lsn` = that position, `_change_seq` = 0.
pub struct BinlogSnapshot {
    rx: tokio::sync::mpsc::Receiver<Result<(TableBatch, Option<CopyPosition>)>>,
    consistent_point: Lsn,
    /// Where the rows returned so far end (`None`: inside a table read as it comes).
    position: Option<CopyPosition>,
}

impl std::fmt::Debug for BinlogSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinlogSnapshot")
            .field("consistent_point", &self.consistent_point)
            .finish()
    }
}

impl BinlogSnapshot {
    /// The binlog position of the snapshot: record it with the snapshot's Delta commit; the
    /// first change read starts there.
    pub fn consistent_point(&self) -> Lsn {
        self.consistent_point
    }

    /// Where the rows returned so far end, to resume from (`None`: inside a table read as
    /// it comes, and after the last table).
    pub fn position(&self) -> Option<CopyPosition> {
        self.position.clone()
    }

    /// The next batch, table by table (a table without rows gives one empty batch); `None`
    /// when all tables were read.
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        match self.rx.recv().await.transpose()? {
            Some((batch, position)) => {
                self.position = position;
                Ok(Some(batch))
            }
            None => {
                self.position = None;
                Ok(None)
            }
        }
    }
}

// --- the change read -------------------------------------------------------------------------

/// Which rows event.
#[derive(Clone, Copy)]
enum RowsKind {
    Insert,
    Update,
    Delete,
}

/// The position after each ALTER of a table still ahead, and the columns its rows have from
/// there on.
type Switches = VecDeque<(Lsn, Vec<BinColumn>)>;

/// What the read does after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Goes on.
    Go,
    /// Looks at the ALTERs ahead first ([`BinlogChanges::resolve`]).
    Resolve,
}

/// An ALTER TABLE (or another statement that changes a table) of a table read, found ahead.
struct Alter {
    table: (String, String),
    /// The position after it.
    end: Lsn,
    changes: Vec<ColumnChange>,
    sql: String,
}

/// A change of the open transaction, held until its commit event.
struct Pending {
    table: (String, String),
    change_type: &'static str,
    cells: Vec<Cell>,
    key_change: bool,
}

/// The transaction being read.
#[derive(Default)]
struct OpenTxn {
    rows: Vec<Pending>,
}

/// A running change read from the binlog. Batches come per table as they fill
/// (`batch_rows`) and at the end.
pub struct BinlogChanges {
    r: Resolved,
    /// The id the binlog client registers with.
    server_id: u32,
    /// The binlog files when the read began, by number.
    files: BTreeMap<u32, String>,
    /// The binlog's end right after the tables' columns were read.
    described_at: Lsn,
    /// The ALTERs up to the fence were looked at ([`BinlogChanges::resolve`]): each table's
    /// `columns` are the ones its rows have at the position read, and `switches` the
    /// columns after each ALTER still ahead.
    resolved: bool,
    /// Per table: the position after each ALTER ahead, and the columns its rows have from
    /// there on.
    switches: HashMap<(String, String), Switches>,
    stream: Option<BinlogStream>,
    options: ReadOptions,
    batch_rows: usize,
    fence: Lsn,
    /// The last position between transactions read up to.
    at: Lsn,
    file_number: u32,
    wanted: HashMap<(String, String), TableLayout>,
    buffers: BTreeMap<TableRef, ChangeBuffer>,
    key_changes: BTreeMap<TableRef, Vec<(i64, i64)>>,
    ready: VecDeque<TableBatch>,
    txn: Option<OpenTxn>,
    summary: ChangeSummary,
    done: bool,
    part_rows: u64,
    part_end: Option<Lsn>,
}

impl std::fmt::Debug for BinlogChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinlogChanges")
            .field("connection", &self.r.spec.name)
            .field("at", &self.at)
            .field("fence", &self.fence)
            .field("summary", &self.summary)
            .finish()
    }
}

impl BinlogChanges {
    /// The fence this read stops at.
    pub fn fence_lsn(&self) -> Lsn {
        self.fence
    }

    /// What the read took; `Some` once [`BinlogChanges::next_batch`] returned `None` at the
    /// end of the read.
    pub fn summary(&self) -> Option<&ChangeSummary> {
        self.done.then_some(&self.summary)
    }

    /// Where the part just read ends, as [`crate::ChangeReader::part_end`].
    pub fn part_end(&self) -> Option<Lsn> {
        self.part_end.filter(|_| self.ready.is_empty())
    }

    /// Goes on to the next part once the one ending at [`BinlogChanges::part_end`] is
    /// committed.
    pub fn next_part(&mut self) {
        self.part_end = None;
        self.part_rows = 0;
    }

    fn err(&self, detail: impl Into<String>, resnapshot: bool) -> SourceError {
        SourceError::Binlog {
            connection: self.r.name().to_string(),
            position: Some(describe_position(self.at)),
            detail: detail.into(),
            resnapshot,
        }
    }

    /// The next batch of one table's changes, or `None` at the end of a part
    /// ([`BinlogChanges::part_end`]) or of the read (then see [`BinlogChanges::summary`]).
    pub async fn next_batch(&mut self) -> Result<Option<TableBatch>> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Ok(Some(b));
            }
            if self.done || self.part_end.is_some() {
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.finish()?;
                continue;
            };
            let next = tokio::time::timeout(self.options.idle_timeout, stream.next()).await;
            let event = match next {
                Err(_) => {
                    return Err(self.err(
                        format!(
                            "the server sent nothing for {} s; check the server and run again",
                            self.options.idle_timeout.as_secs()
                        ),
                        false,
                    ))
                }
                Ok(None) => {
                    self.close().await;
                    if self.txn.is_some() || self.at < self.fence {
                        return Err(self.err(
                            format!(
                                "the binlog stream ended before {} (the binlog's end when the \
                                 read began); run again",
                                describe_position(self.fence)
                            ),
                            false,
                        ));
                    }
                    self.summary.complete = true;
                    continue;
                }
                Ok(Some(Err(e))) => {
                    let text = self.r.scrub(&e.to_string());
                    let purged = text.contains("1236") || text.contains("Could not find first log");
                    return Err(self.err(format!("the binlog stream failed: {text}"), purged));
                }
                Ok(Some(Ok(event))) => event,
            };
            if self.handle(&event)? == Step::Resolve {
                self.resolve().await?;
                continue;
            }
            if self.txn.is_none() && self.at >= self.fence {
                self.summary.complete = true;
                self.close().await;
            }
        }
    }

    /// A binlog stream on `conn` from `from` (a position between transactions).
    async fn open_stream(&self, conn: Conn, from: Lsn) -> Result<BinlogStream> {
        let (n, offset) = lsn_position(from);
        let file = self.files.get(&n).ok_or_else(|| {
            self.err(
                format!("the server has no binlog file #{n} (purged during the read?)"),
                true,
            )
        })?;
        let request = BinlogStreamRequest::new(self.server_id)
            .with_filename(file.as_bytes())
            .with_pos(offset as u64)
            .with_non_blocking();
        conn.get_binlog_stream(request)
            .await
            .map_err(|e| self.err(self.r.scrub(&e.to_string()), false))
    }

    /// Rows whose column count is not the table's, or an ALTER of a table read, before the
    /// ALTERs ahead were looked at: the binlog is read from here to the end the tables'
    /// columns were read at, for every ALTER of the tables read; each table's columns here
    /// are its columns now without those the ALTERs added ([`alter::timeline`]), and the
    /// read starts again from here (the position between transactions the read is at; the
    /// open transaction is read again). An ALTER that did more than add columns stops the
    /// read, naming the column and what happened to it.
    async fn resolve(&mut self) -> Result<()> {
        self.close().await;
        self.txn = None;
        self.resolved = true;
        let from = self.at;
        let alters = self.alters_ahead(from).await?;
        let keys: Vec<(String, String)> = self.wanted.keys().cloned().collect();
        for key in keys {
            let mine: Vec<&Alter> = alters.iter().filter(|a| a.table == key).collect();
            if mine.is_empty() {
                continue;
            }
            let layout = &self.wanted[&key];
            if let Some(late) = mine.iter().find(|a| a.end > self.fence) {
                return Err(self.err(
                    format!(
                        "table {} was changed (`{}`) while this read began; run again",
                        layout.table, late.sql
                    ),
                    false,
                ));
            }
            let names: Vec<String> = layout.columns.iter().map(|c| c.name.clone()).collect();
            let changes: Vec<Vec<ColumnChange>> = mine.iter().map(|a| a.changes.clone()).collect();
            let (start, after) = alter::timeline(&names, &changes).map_err(|detail| {
                let sql = mine
                    .iter()
                    .find(|a| a.changes.iter().any(|c| c.refusal().is_some()))
                    .or(mine.last())
                    .map_or("", |a| a.sql.as_str());
                self.cannot_follow(&layout.table, &detail, sql)
            })?;
            let pick = |idx: &[usize]| -> Vec<BinColumn> {
                idx.iter().map(|&i| layout.columns[i].clone()).collect()
            };
            let switches = mine
                .iter()
                .zip(&after)
                .map(|(a, idx)| (a.end, pick(idx)))
                .collect();
            let columns = pick(&start);
            self.switches.insert(key.clone(), switches);
            if let Some(l) = self.wanted.get_mut(&key) {
                l.columns = columns;
            }
        }
        let conn = self.r.mysql_connect().await?;
        self.file_number = lsn_position(from).0;
        self.stream = Some(self.open_stream(conn, from).await?);
        Ok(())
    }

    /// The ALTERs of the tables read logged after `from` up to the end the tables' columns
    /// were read at, in binlog order, read from a stream of their own.
    async fn alters_ahead(&self, from: Lsn) -> Result<Vec<Alter>> {
        let conn = self.r.mysql_connect().await?;
        let mut stream = self.open_stream(conn, from).await?;
        let mut number = lsn_position(from).0;
        let mut out = Vec::new();
        loop {
            let next = tokio::time::timeout(self.options.idle_timeout, stream.next()).await;
            let event = match next {
                Err(_) => {
                    return Err(self.err(
                        "the server sent nothing while strata looked for ALTER TABLE ahead; \
                         check the server and run again",
                        false,
                    ))
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    let text = self.r.scrub(&e.to_string());
                    return Err(self.err(format!("the binlog stream failed: {text}"), false));
                }
                Ok(Some(Ok(event))) => event,
            };
            let log_pos = event.header().log_pos();
            let kind = event.header().event_type();
            // Only rotations and statements matter here: rows are not decoded.
            let wanted = matches!(
                kind,
                Ok(mysql_async::binlog::EventType::ROTATE_EVENT)
                    | Ok(mysql_async::binlog::EventType::QUERY_EVENT)
            );
            if wanted {
                let data = event
                    .read_data()
                    .map_err(|e| self.err(format!("cannot decode a binlog event: {e}"), false))?;
                match data {
                    Some(EventData::RotateEvent(rot)) if log_pos > 0 => {
                        if let Some(n) = file_number(&rot.name()) {
                            number = n;
                        }
                    }
                    Some(EventData::QueryEvent(q)) => {
                        let end = Lsn(((number as u64) << 32) | log_pos as u64);
                        let sql = q.query().to_string();
                        let schema = q.schema().to_string();
                        let (tables, changes) = match classify(&sql) {
                            Statement::Alter(t, c) => (vec![t], c),
                            Statement::Ddl(verb, t) => (t, vec![ColumnChange::Other(verb)]),
                            _ => (vec![], vec![]),
                        };
                        for table in self.named(&schema, &tables) {
                            out.push(Alter {
                                table,
                                end,
                                changes: changes.clone(),
                                sql: sql.trim().to_string(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            let at = Lsn(((number as u64) << 32) | log_pos as u64);
            if log_pos > 0 && at >= self.described_at {
                break;
            }
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), stream.close()).await;
        Ok(out)
    }

    /// The error of an ALTER binlog CDC cannot follow: the table, what happened to the
    /// column, the statement; the engine adds the full-refresh command.
    fn cannot_follow(&self, table: &TableRef, detail: &str, sql: &str) -> SourceError {
        self.err(
            format!(
                "table {table}: {detail} (`{sql}`); binlog CDC follows columns added to a \
                 table, not this, so this needs a new snapshot: run a full refresh of the \
                 tables read from it"
            ),
            true,
        )
    }

    async fn close(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.close()).await;
        }
    }

    fn finish(&mut self) -> Result<()> {
        self.flush_all()?;
        self.summary.resume_lsn = if self.summary.complete {
            self.at.max(self.summary.resume_lsn)
        } else {
            self.summary
                .last_commit_end_lsn
                .unwrap_or(self.summary.resume_lsn)
        };
        self.done = true;
        Ok(())
    }

    fn flush_all(&mut self) -> Result<()> {
        let tables: Vec<TableRef> = self.buffers.keys().cloned().collect();
        for t in tables {
            self.flush(&t)?;
        }
        Ok(())
    }

    fn flush(&mut self, t: &TableRef) -> Result<()> {
        if let Some(buf) = self.buffers.get_mut(t) {
            if buf.rows == 0 {
                return Ok(());
            }
            let batch = finish(buf, t)?;
            self.ready.push_back(TableBatch {
                table: t.clone(),
                batch,
                added_columns: vec![],
                key_changes: self.key_changes.remove(t).unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// The position after `event` in the current file, if it has one (artificial events
    /// have 0).
    fn end_of(&self, log_pos: u32) -> Option<Lsn> {
        (log_pos > 0).then_some(Lsn(((self.file_number as u64) << 32) | log_pos as u64))
    }

    fn handle(&mut self, event: &mysql_async::binlog::events::Event) -> Result<Step> {
        let header = event.header();
        let end = self.end_of(header.log_pos());
        let data = event
            .read_data()
            .map_err(|e| self.err(format!("cannot decode a binlog event: {e}"), false))?;
        match data {
            // The artificial rotate a stream starts with names the file the read asked for
            // (and, sent before the server's checksum setting is known, can carry the
            // checksum's bytes after the name): the position already says that file.
            Some(EventData::RotateEvent(_)) if end.is_none() => {}
            Some(EventData::RotateEvent(rot)) => {
                let name = rot.name();
                let n = file_number(&name).ok_or_else(|| {
                    self.err(format!("binlog file name '{name}' has no number"), false)
                })?;
                self.file_number = n;
                if self.txn.is_none() {
                    let to = Lsn(((n as u64) << 32) | (rot.position() & 0xFFFF_FFFF));
                    self.at = self.at.max(to);
                }
            }
            Some(EventData::QueryEvent(q)) => {
                let sql = q.query();
                match classify(&sql) {
                    Statement::Begin => self.txn = Some(OpenTxn::default()),
                    Statement::Commit => self.commit(end, header.timestamp())?,
                    Statement::Rollback => {
                        self.txn = None;
                        self.between(end);
                    }
                    Statement::Truncate(tables) => {
                        let schema = q.schema().to_string();
                        let hit: Vec<(String, String)> = self.named(&schema, &tables);
                        let txn = self.txn.get_or_insert_with(OpenTxn::default);
                        for table in hit {
                            txn.rows.push(Pending {
                                table,
                                change_type: meta::TRUNCATE,
                                cells: vec![],
                                key_change: false,
                            });
                        }
                        self.commit(end, header.timestamp())?;
                    }
                    Statement::Alter(table, changes) => {
                        let schema = q.schema().to_string();
                        if let Some(key) = self.named(&schema, &[table]).into_iter().next() {
                            return self.altered(key, &changes, &sql, end);
                        }
                        self.between(end);
                    }
                    Statement::Ddl(verb, tables) => {
                        let schema = q.schema().to_string();
                        if let Some((db, name)) = self.named(&schema, &tables).into_iter().next() {
                            return Err(self.err(
                                format!(
                                    "table {db}.{name} was changed by {verb} (`{}`); binlog CDC \
                                     reads a table's rows by the columns it had when the read \
                                     began, so this needs a new snapshot: run a full refresh of \
                                     the tables read from it",
                                    sql.trim()
                                ),
                                true,
                            ));
                        }
                        self.between(end);
                    }
                    Statement::Other => {
                        if self.txn.is_none() {
                            self.between(end);
                        }
                    }
                }
            }
            Some(EventData::XidEvent(_)) => self.commit(end, header.timestamp())?,
            Some(EventData::RowsEvent(rows)) => return self.rows(&rows),
            // Inside an event group: a GTID event starts one (the position after it is not
            // between transactions).
            Some(EventData::TableMapEvent(_))
            | Some(EventData::FormatDescriptionEvent(_))
            | Some(EventData::GtidEvent(_))
            | Some(EventData::AnonymousGtidEvent(_)) => {}
            _ => {
                if self.txn.is_none() {
                    self.between(end);
                }
            }
        }
        Ok(Step::Go)
    }

    /// The tables of `tables` (as a statement in database `schema` names them) that this
    /// read takes.
    fn named(&self, schema: &str, tables: &[(Option<String>, String)]) -> Vec<(String, String)> {
        tables
            .iter()
            .map(|(db, name)| {
                (
                    db.clone().unwrap_or_else(|| schema.to_string()),
                    name.clone(),
                )
            })
            .filter(|k| self.wanted.contains_key(k))
            .collect()
    }

    /// An ALTER TABLE of a table read, ending at `end`: refused when it did more than add
    /// columns; before the ALTERs ahead were looked at, a [`Step::Resolve`]; then the
    /// table's rows take the columns it has after the ALTER.
    fn altered(
        &mut self,
        key: (String, String),
        changes: &[ColumnChange],
        sql: &str,
        end: Option<Lsn>,
    ) -> Result<Step> {
        let table = self.wanted[&key].table.clone();
        if let Some(refusal) = changes.iter().find_map(ColumnChange::refusal) {
            return Err(self.cannot_follow(&table, &refusal, sql.trim()));
        }
        if !self.resolved {
            return Ok(Step::Resolve);
        }
        let next = self.switches.get_mut(&key).and_then(VecDeque::pop_front);
        match next {
            Some((at, columns)) if Some(at) == end => {
                if let Some(l) = self.wanted.get_mut(&key) {
                    l.columns = columns;
                }
                self.between(end);
                Ok(Step::Go)
            }
            _ => Err(self.err(
                format!(
                    "table {table}: `{}` is not where strata found it when it looked ahead in \
                     the binlog; run again",
                    sql.trim()
                ),
                false,
            )),
        }
    }

    /// A position between transactions.
    fn between(&mut self, end: Option<Lsn>) {
        if let Some(end) = end {
            self.at = self.at.max(end);
        }
    }

    fn rows(&mut self, data: &RowsEventData<'_>) -> Result<Step> {
        let stream = self
            .stream
            .as_ref()
            .ok_or_else(|| self.err("rows without a stream", false))?;
        let tme = stream
            .get_tme(data.table_id())
            .ok_or_else(|| self.err("a rows event without its table map event", false))?;
        let key = (
            tme.database_name().to_string(),
            tme.table_name().to_string(),
        );
        let Some(layout) = self.wanted.get(&key) else {
            return Ok(Step::Go);
        };
        let err = |detail: String, resnapshot: bool| SourceError::Binlog {
            connection: self.r.name().to_string(),
            position: Some(describe_position(self.at)),
            detail,
            resnapshot,
        };
        if tme.columns_count() as usize != layout.columns.len() {
            if !self.resolved {
                return Ok(Step::Resolve);
            }
            return Err(err(
                format!(
                    "the binlog's rows of table {} have {} columns but the table has {} now (its \
                     columns changed after the position strata recorded); this needs a new \
                     snapshot: run a full refresh of the tables read from it",
                    layout.table,
                    tme.columns_count(),
                    layout.columns.len()
                ),
                true,
            ));
        }
        let (kind, image) = match data {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => {
                (RowsKind::Insert, "after")
            }
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => {
                (RowsKind::Delete, "before")
            }
            RowsEventData::UpdateRowsEvent(_) | RowsEventData::UpdateRowsEventV1(_) => {
                (RowsKind::Update, "before and after")
            }
            RowsEventData::PartialUpdateRowsEvent(_) => {
                return Err(err(
                    "the binlog holds partial JSON updates; set binlog_row_value_options='' \
                     on the server so that it logs whole values"
                        .into(),
                    false,
                ))
            }
        };
        let mut out = Vec::new();
        for row in data.rows(tme) {
            let (before, after) = row.map_err(|e| {
                err(
                    format!("cannot decode a row of {}: {e}", layout.table),
                    false,
                )
            })?;
            let cells = |r: &Option<BinlogRow>| -> Result<Vec<Cell>> {
                let r = r.as_ref().ok_or_else(|| {
                    err(
                        format!(
                            "a row of {} lacks its {image} image (binlog_row_image must be FULL)",
                            layout.table
                        ),
                        false,
                    )
                })?;
                decode_row(&self.r, layout, r)
            };
            match kind {
                RowsKind::Update => {
                    let old = cells(&before)?;
                    let new = cells(&after)?;
                    // A key change: the old key is deleted, then the new one written.
                    let moved = layout.key.iter().any(|&i| old[i] != new[i]);
                    if moved {
                        out.push((meta::DELETE, old, false));
                    }
                    out.push((meta::UPDATE, new, moved));
                }
                RowsKind::Delete => out.push((meta::DELETE, cells(&before)?, false)),
                RowsKind::Insert => out.push((meta::INSERT, cells(&after)?, false)),
            }
        }
        let txn = self.txn.get_or_insert_with(OpenTxn::default);
        for (change_type, cells, key_change) in out {
            txn.rows.push(Pending {
                table: key.clone(),
                change_type,
                cells,
                key_change,
            });
        }
        Ok(Step::Go)
    }

    /// The end of a transaction at `end`: its rows are taken, with that position.
    fn commit(&mut self, end: Option<Lsn>, timestamp: u32) -> Result<()> {
        let txn = self.txn.take().unwrap_or_default();
        let Some(end) = end else {
            return Err(self.err("a commit event without a position", false));
        };
        self.at = self.at.max(end);
        if txn.rows.is_empty() {
            return Ok(());
        }
        let micros = timestamp as i64 * 1_000_000;
        let n = txn.rows.len() as u64;
        for (seq, p) in txn.rows.into_iter().enumerate() {
            let Some(layout) = self.wanted.get(&p.table) else {
                continue;
            };
            let table = layout.table.clone();
            let buf = self
                .buffers
                .get_mut(&table)
                .ok_or_else(|| SourceError::Binlog {
                    connection: self.r.name().to_string(),
                    position: None,
                    detail: format!("no buffer for table {table} (a bug in strata)"),
                    resnapshot: false,
                })?;
            for (i, c) in p.cells.iter().enumerate() {
                let (name, _, b) = &mut buf.columns[i];
                b.append_value(c)
                    .map_err(|d| value_error(&self.r, &table, name, d))?;
            }
            buf.end_row(p.change_type, end.to_i64(), seq as i64, Some(micros), &[]);
            if p.key_change {
                self.key_changes
                    .entry(table.clone())
                    .or_default()
                    .push((end.to_i64(), seq as i64));
            }
            if buf.rows >= self.batch_rows {
                self.flush(&table)?;
            }
        }
        self.summary.transactions += 1;
        self.summary.rows += n;
        self.summary.last_commit_end_lsn = Some(end);
        self.summary.resume_lsn = end;
        self.part_rows += n;
        if self
            .options
            .part_changes
            .is_some_and(|m| self.part_rows >= m)
        {
            self.flush_all()?;
            self.part_end = Some(end);
        }
        if self
            .options
            .max_changes
            .is_some_and(|m| self.summary.rows >= m)
        {
            self.stream = None;
            self.finish()?;
        }
        Ok(())
    }
}

/// A binlog row as the cells of the table's kept columns, in buffer order.
fn decode_row(r: &Resolved, layout: &TableLayout, row: &BinlogRow) -> Result<Vec<Cell>> {
    let mut cells = vec![Cell::Null; layout.schema.columns.len()];
    for (i, col) in layout.columns.iter().enumerate() {
        let Some(slot) = col.slot else {
            continue;
        };
        cells[slot] = col
            .cell(row.as_ref(i))
            .map_err(|d| value_error(r, &layout.table, &col.name, d))?;
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_keep_their_order_as_lsns() {
        assert_eq!(file_number("binlog.000012"), Some(12));
        assert_eq!(
            file_number("/var/lib/mysql/mysql-bin.999999"),
            Some(999_999)
        );
        assert_eq!(file_number("binlog"), None);
        assert_eq!(file_number("binlog.index"), None);
        let a = position_lsn("binlog.000001", 4_000_000).unwrap();
        let b = position_lsn("binlog.000002", 4).unwrap();
        assert!(a < b, "a later file is a later position");
        assert_eq!(lsn_position(b), (2, 4));
        assert_eq!(b.to_string(), "2/4");
        assert_eq!(describe_position(b), "binlog file #2, offset 4");
        assert!(position_lsn("binlog.000001", 1 << 33).is_none());
    }

    #[test]
    fn settings_name_what_to_change() {
        assert!(check_settings(Some("1"), Some("ROW"), Some("FULL")).is_ok());
        assert!(check_settings(Some("ON"), Some("row"), None).is_ok());
        let off = check_settings(Some("0"), Some("ROW"), Some("FULL")).unwrap_err();
        assert!(
            off.contains("log_bin = OFF") && off.contains("log-bin"),
            "{off}"
        );
        let mixed = check_settings(Some("1"), Some("MIXED"), Some("FULL")).unwrap_err();
        assert!(mixed.contains("binlog_format = MIXED") && mixed.contains("binlog_format=ROW"));
        let minimal = check_settings(Some("1"), Some("ROW"), Some("MINIMAL")).unwrap_err();
        assert!(minimal.contains("binlog_row_image=FULL"), "{minimal}");
    }

    fn t(db: Option<&str>, name: &str) -> (Option<String>, String) {
        (db.map(String::from), name.to_string())
    }

    #[test]
    fn statements_that_touch_tables_are_recognised() {
        assert_eq!(classify("BEGIN"), Statement::Begin);
        assert_eq!(classify("COMMIT"), Statement::Commit);
        assert_eq!(classify("ROLLBACK"), Statement::Rollback);
        assert_eq!(
            classify("TRUNCATE TABLE `crm`.`Customers`"),
            Statement::Truncate(vec![t(Some("crm"), "Customers")])
        );
        assert_eq!(
            classify("/* app */ truncate orders"),
            Statement::Truncate(vec![t(None, "orders")])
        );
        assert_eq!(
            classify("ALTER ONLINE TABLE o ADD COLUMN x INT"),
            Statement::Alter(t(None, "o"), vec![ColumnChange::Added(vec!["x".into()])])
        );
        assert_eq!(
            classify("ALTER TABLE db.o DROP COLUMN x"),
            Statement::Alter(t(Some("db"), "o"), vec![ColumnChange::Dropped("x".into())])
        );
        assert_eq!(classify("ALTER DATABASE d COMMENT 'x'"), Statement::Other);
        assert_eq!(
            classify("DROP TABLE IF EXISTS `a`, db.b /* generated by server */"),
            Statement::Ddl("DROP TABLE".into(), vec![t(None, "a"), t(Some("db"), "b")])
        );
        assert_eq!(
            classify("RENAME TABLE a TO b, c TO d.e"),
            Statement::Ddl(
                "RENAME TABLE".into(),
                vec![t(None, "a"), t(None, "b"), t(None, "c"), t(Some("d"), "e")]
            )
        );
        assert_eq!(classify("DROP TEMPORARY TABLE x"), Statement::Other);
        assert_eq!(classify("CREATE TABLE x (a INT)"), Statement::Other);
        assert_eq!(
            classify("# Dummy event replacing event type 160"),
            Statement::Other
        );
    }

    #[test]
    fn enum_and_set_labels_are_read_from_the_column_type() {
        assert_eq!(
            enum_labels("enum('new','it''s','a,b')"),
            Some((false, vec!["new".into(), "it's".into(), "a,b".into()]))
        );
        assert_eq!(
            enum_labels("set('x','y','z')"),
            Some((true, vec!["x".into(), "y".into(), "z".into()]))
        );
        assert_eq!(enum_labels("varchar(10)"), None);
        let labels = vec!["x".to_string(), "y".into(), "z".into()];
        assert_eq!(
            label_cell(false, &labels, &Value::Int(2)),
            Ok(Cell::Str("y".into()))
        );
        assert_eq!(
            label_cell(true, &labels, &Value::Bytes(vec![0b101])),
            Ok(Cell::Str("x,z".into()))
        );
        assert!(label_cell(false, &labels, &Value::Int(9)).is_err());
    }

    #[test]
    fn binlog_values_become_the_watermark_reads_cells() {
        let col = |decode, unsigned_bits, epoch| BinColumn {
            slot: Some(0),
            name: "c".into(),
            decode,
            unsigned_bits,
            epoch,
            labels: None,
        };
        let v = |v: Value| BinlogValue::Value(v);
        // A TINYINT UNSIGNED logged without its signedness comes as a negative byte.
        assert_eq!(
            col(MyDecode::Int, Some(8), false).cell(Some(&v(Value::Int(-56)))),
            Ok(Cell::Int(200))
        );
        assert_eq!(
            col(MyDecode::U64Decimal, None, false).cell(Some(&v(Value::Int(-1)))),
            Ok(Cell::Decimal(u64::MAX as i128))
        );
        assert_eq!(
            col(MyDecode::DateTime, None, true)
                .cell(Some(&v(Value::Bytes(b"1704067200.25".to_vec())))),
            Ok(Cell::Micros(1_704_067_200_250_000))
        );
        assert_eq!(
            col(MyDecode::Int, None, false).cell(Some(&v(Value::NULL))),
            Ok(Cell::Null)
        );
        assert_eq!(col(MyDecode::Int, None, false).cell(None), Ok(Cell::Null));
        assert!(epoch_micros("12x").is_err());
    }

    #[test]
    fn client_ids_are_stable_and_apart_from_server_ids() {
        let a = client_server_id("strata_orders");
        assert_eq!(a, client_server_id("strata_orders"));
        assert_ne!(a, client_server_id("strata_customers"));
        assert!((1 << 30..1 << 31).contains(&a));
    }
}
