//! The options of `read_database('conn', table => ..., watermark => ..., ...)`, checked
//! into what `strata-sources` reads with. Pure: no connection is made here.

use strata_sources::{
    CdcConfig, CdcTable, Overlap, SourceObject, TableRef, WatermarkRead, DEFAULT_BATCH_ROWS,
};
use strata_sql::ReadDatabase;

/// The options `read_database` takes in each mode.
const WATERMARK_OPTIONS: [&str; 11] = [
    "mode",
    "table",
    "query",
    "watermark",
    "overlap",
    "exclude",
    "batch_rows",
    "chunk_rows",
    "chunk_bytes",
    "parallel",
    "first_load",
];
const CDC_OPTIONS: [&str; 8] = [
    "mode",
    "table",
    "slot",
    "publication",
    "exclude",
    "batch_rows",
    "chunk_rows",
    "first_load",
];

/// The default size of a CDC run's commit: this many changes (then the next transaction
/// end), about 200-500 MiB of a run's memory for a table of ten columns.
pub(crate) const DEFAULT_CDC_CHUNK_ROWS: usize = 250_000;

/// A checked `read_database`.
#[derive(Debug, Clone)]
pub(crate) struct DatabaseRead {
    pub(crate) connection: String,
    pub(crate) object: SourceObject,
    pub(crate) exclude: Vec<String>,
    pub(crate) batch_rows: usize,
    pub(crate) mode: ReadMode,
}

/// The default size of a watermark load's commit: 128 MiB of rows as Arrow holds them.
pub(crate) const DEFAULT_CHUNK_BYTES: usize = 128 << 20;

/// When a watermark load commits what it has read so far (`chunk_rows`, `chunk_bytes`):
/// once the rows it holds reach either limit, at the next change of the watermark, so
/// that rows sharing one watermark value are always in one commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkSize {
    pub(crate) rows: Option<usize>,
    pub(crate) bytes: usize,
}

impl Default for ChunkSize {
    fn default() -> Self {
        ChunkSize {
            rows: None,
            bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

impl ChunkSize {
    /// Whether a chunk holding `rows` rows of `bytes` bytes is full.
    pub(crate) fn full(&self, rows: usize, bytes: usize) -> bool {
        bytes >= self.bytes || self.rows.is_some_and(|r| rows >= r)
    }
}

/// How a watermark source's first load (no watermark stored yet) reads a table
/// (`first_load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum FirstLoad {
    /// `'scan'` (the default): PostgreSQL reads the table as it lies on disk, in parallel
    /// ranges of its pages; the rows are written to data files as they come and committed
    /// once, with the highest watermark. A killed first load starts over. Queries and
    /// MySQL / MariaDB tables are read as by `'chunks'`.
    #[default]
    Scan,
    /// `'chunks'`: in watermark order, committed in chunks as every later run is, so a
    /// killed first load resumes after its last chunk.
    Chunks,
}

/// How new rows are found.
#[derive(Debug, Clone)]
pub(crate) enum ReadMode {
    /// `mode => 'watermark'` (the default): rows above the stored watermark columns, from
    /// an overlap window before it when set.
    Watermark {
        columns: Vec<String>,
        overlap: Option<Overlap>,
        chunk: ChunkSize,
        /// `parallel => N`: PostgreSQL reads N ranges of the leading watermark column
        /// concurrently, in one snapshot (`None`: chosen from the table's size).
        parallel: Option<usize>,
        first_load: FirstLoad,
    },
    /// `mode => 'cdc'`: the table's changes through a PostgreSQL logical replication slot
    /// and publication, or the MySQL / MariaDB binlog (`slot` then only names the binlog
    /// client's server id; `publication` is unused); the first run copies the table in a
    /// consistent snapshot.
    /// A run commits its changes in parts of `chunk_rows` changes (ended at a transaction
    /// end), each with the position to resume from. The first copy (`first_load`) reads a
    /// table with a primary key in key order and commits it in parts of `chunk_rows` rows,
    /// resumable (`Chunks`, the default), or as it lies, committed once (`Scan`).
    Changes {
        slot: String,
        publication: String,
        chunk_rows: usize,
        first_load: FirstLoad,
    },
}

/// How the streaming table a database source creates writes the columns that gain nothing
/// from Parquet's dictionary or codec: its table properties, unless the pipeline sets them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ColumnLayout {
    /// Written without a dictionary (`strata.parquet.plainColumns`).
    pub(crate) plain: Vec<String>,
    /// Written without compression (`strata.parquet.uncompressedColumns`).
    pub(crate) uncompressed: Vec<String>,
}

impl ColumnLayout {
    /// The table properties that say this layout, each with its comma-separated columns;
    /// none for an empty list.
    pub(crate) fn properties(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        use crate::storage::write::{PLAIN_COLUMNS_PROPERTY, UNCOMPRESSED_COLUMNS_PROPERTY};
        [
            (PLAIN_COLUMNS_PROPERTY, &self.plain),
            (UNCOMPRESSED_COLUMNS_PROPERTY, &self.uncompressed),
        ]
        .into_iter()
        .filter(|(_, columns)| !columns.is_empty())
        .map(|(property, columns)| (property, columns.join(",")))
    }
}

impl DatabaseRead {
    /// The layout of the columns of `described` (the source's description): those whose
    /// values are nearly all distinct go without a dictionary ([`Self::plain_columns`]);
    /// uuid columns, random hex digits as text that Snappy leaves at about 0.9 of their
    /// size, go uncompressed as well (on the benchmark table that is 15% less CPU and a
    /// third less memory for a first load, for 6% more bytes).
    pub(crate) fn column_layout(&self, described: &strata_sources::SourceSchema) -> ColumnLayout {
        ColumnLayout {
            plain: self.plain_columns(described),
            uncompressed: described
                .columns
                .iter()
                .filter(|c| c.source_type.eq_ignore_ascii_case("uuid"))
                .map(|c| c.name.clone())
                .collect(),
        }
    }

    /// The columns of `described` whose values are nearly all distinct, to be written
    /// without a Parquet dictionary: uuid columns, the watermark columns, and those the
    /// source calls distinct (a unique index, its statistics). A dictionary there saves no
    /// space, and building one until it overflows is a hash of every value on write (about
    /// 5% of a first load's CPU on the benchmark table).
    fn plain_columns(&self, described: &strata_sources::SourceSchema) -> Vec<String> {
        let watermark: &[String] = match &self.mode {
            ReadMode::Watermark { columns, .. } => columns,
            ReadMode::Changes { .. } => &[],
        };
        described
            .columns
            .iter()
            .filter(|c| {
                c.distinct
                    || c.source_type.eq_ignore_ascii_case("uuid")
                    || watermark.iter().any(|w| w.eq_ignore_ascii_case(&c.name))
            })
            .map(|c| c.name.clone())
            .collect()
    }

    /// The watermark read as `strata-sources` takes it (the lower bound is set per run);
    /// `None` in CDC mode.
    pub(crate) fn watermark_read(&self) -> Option<WatermarkRead> {
        let ReadMode::Watermark {
            columns, parallel, ..
        } = &self.mode
        else {
            return None;
        };
        Some(
            WatermarkRead::new(self.object.clone(), columns.clone())
                .exclude(self.exclude.clone())
                .batch_rows(self.batch_rows)
                .parallel(*parallel),
        )
    }

    /// The CDC source's configuration; `None` in watermark mode.
    pub(crate) fn cdc_config(&self) -> Option<CdcConfig> {
        let (
            ReadMode::Changes {
                slot, publication, ..
            },
            SourceObject::Table(t),
        ) = (&self.mode, &self.object)
        else {
            return None;
        };
        let mut cfg = CdcConfig::new(slot, publication, vec![t.clone()]);
        cfg.tables = vec![CdcTable {
            table: t.clone(),
            exclude_columns: self.exclude.clone(),
        }];
        cfg.batch_rows = self.batch_rows;
        Some(cfg)
    }

    /// The source table in CDC mode.
    pub(crate) fn cdc_table(&self) -> Option<&TableRef> {
        match (&self.mode, &self.object) {
            (ReadMode::Changes { .. }, SourceObject::Table(t)) => Some(t),
            _ => None,
        }
    }
}

/// A replication slot or publication name made of `hint` (the streaming table's name):
/// `strata_` then lower-case letters, digits and `_`, at most 63 characters.
pub(crate) fn default_slot_name(hint: &str) -> String {
    let mut name: String = format!("strata_{hint}")
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    name.truncate(63);
    name
}

/// Checks `rd`'s options; `hint` names the default slot and publication (the streaming
/// table or flow). The error says which option and what it takes.
pub(crate) fn database_read(rd: &ReadDatabase, hint: &str) -> Result<DatabaseRead, String> {
    let get = |k: &str| rd.options.get(k).map(String::as_str);
    let cdc = match get("mode").map(str::to_ascii_lowercase).as_deref() {
        None | Some("watermark") => false,
        Some("cdc") => true,
        Some(other) => {
            return Err(format!(
                "read_database mode '{other}' is not known: 'watermark' (the default) or 'cdc'"
            ))
        }
    };
    let allowed: &[&str] = if cdc {
        &CDC_OPTIONS
    } else {
        &WATERMARK_OPTIONS
    };
    if let Some(k) = rd.options.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "read_database option '{k}' is not known in {} mode; it takes {}",
            if cdc { "cdc" } else { "watermark" },
            allowed.join(", ")
        ));
    }
    let batch_rows = match get("batch_rows") {
        None => DEFAULT_BATCH_ROWS,
        Some(n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("batch_rows '{n}' is not a positive number of rows")),
        },
    };
    if cdc {
        let table = get("table").ok_or_else(|| {
            "read_database in cdc mode reads one table: table => 'schema.table'".to_string()
        })?;
        let name = default_slot_name(hint);
        return Ok(DatabaseRead {
            connection: rd.connection.clone(),
            object: SourceObject::table(table).map_err(|e| e.to_string())?,
            exclude: names(get("exclude")),
            batch_rows,
            mode: ReadMode::Changes {
                slot: get("slot").map_or_else(|| name.clone(), str::to_string),
                publication: get("publication").map_or(name, str::to_string),
                chunk_rows: get("chunk_rows")
                    .map(|n| positive(n, "chunk_rows", "changes"))
                    .transpose()?
                    .unwrap_or(DEFAULT_CDC_CHUNK_ROWS),
                first_load: get("first_load")
                    .map(first_load)
                    .transpose()?
                    .unwrap_or(FirstLoad::Chunks),
            },
        });
    }
    let object = match (get("table"), get("query")) {
        (Some(t), None) => SourceObject::table(t).map_err(|e| e.to_string())?,
        (None, Some(q)) => SourceObject::Query(q.to_string()),
        _ => {
            return Err(
                "read_database reads either table => 'schema.table' or query => 'SELECT ...'"
                    .to_string(),
            )
        }
    };
    let watermark = names(get("watermark"));
    if watermark.is_empty() {
        return Err(
            "read_database needs watermark => 'column[, column ...]': the columns whose \
             growing values say which rows are new (an updated_at timestamp, an id)"
                .to_string(),
        );
    }
    Ok(DatabaseRead {
        connection: rd.connection.clone(),
        object,
        exclude: names(get("exclude")),
        batch_rows,
        mode: ReadMode::Watermark {
            columns: watermark,
            overlap: get("overlap").map(parse_overlap).transpose()?,
            chunk: ChunkSize {
                rows: get("chunk_rows")
                    .map(|n| positive(n, "chunk_rows", "rows"))
                    .transpose()?,
                bytes: get("chunk_bytes")
                    .map(parse_bytes)
                    .transpose()?
                    .unwrap_or(DEFAULT_CHUNK_BYTES),
            },
            parallel: get("parallel")
                .map(|n| positive(n, "parallel", "ranges"))
                .transpose()?,
            first_load: get("first_load")
                .map(first_load)
                .transpose()?
                .unwrap_or_default(),
        },
    })
}

/// `first_load => 'scan' | 'chunks'`.
fn first_load(text: &str) -> Result<FirstLoad, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "scan" => Ok(FirstLoad::Scan),
        "chunks" => Ok(FirstLoad::Chunks),
        _ => Err(format!(
            "first_load '{text}' is not known: 'scan' (the table as it lies on disk, \
             committed once; a watermark load's default) or 'chunks' (in watermark or key \
             order, committed in chunks; a CDC copy's default)"
        )),
    }
}

/// `'1000'` → 1000; anything else is an error naming `option`.
fn positive(text: &str, option: &str, unit: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{option} '{text}' is not a positive number of {unit}"
        )),
    }
}

/// `'67108864'`, `'64MB'`, `'1 GB'`, `'512 KiB'` → bytes (KB/MB/GB and KiB/MiB/GiB both
/// count in 1024s).
pub(crate) fn parse_bytes(text: &str) -> Result<usize, String> {
    let bad = || format!("chunk_bytes '{text}' is not a size such as '128MB' or '1GB'");
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n = t[..split].parse::<usize>().map_err(|_| bad())?;
    let unit = t[split..].trim().to_ascii_lowercase();
    let scale: usize = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return Err(bad()),
    };
    match n.checked_mul(scale) {
        Some(b) if b > 0 => Ok(b),
        _ => Err(bad()),
    }
}

/// `'a, b'` → `["a", "b"]`.
fn names(list: Option<&str>) -> Vec<String> {
    list.into_iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// `'500'` (an amount of the watermark's unit, for integer and decimal columns) or
/// `'10 minutes'` (seconds, minutes, hours, days; for timestamp and date columns).
pub(crate) fn parse_overlap(text: &str) -> Result<Overlap, String> {
    let bad = || {
        format!(
            "overlap '{text}' is neither a number (for integer watermarks) nor a duration \
             such as '10 minutes' (seconds, minutes, hours, days)"
        )
    };
    let mut words = text.split_whitespace();
    let amount = words.next().ok_or_else(bad)?;
    let unit = words.next();
    if words.next().is_some() {
        return Err(bad());
    }
    let Some(unit) = unit else {
        return amount
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(Overlap::Amount)
            .ok_or_else(bad);
    };
    let n = amount.parse::<u64>().map_err(|_| bad())?;
    let seconds = match unit.to_ascii_lowercase().trim_end_matches('s') {
        "second" | "sec" => 1,
        "minute" | "min" => 60,
        "hour" => 3600,
        "day" => 86_400,
        _ => return Err(bad()),
    };
    Ok(Overlap::Duration(std::time::Duration::from_secs(
        n * seconds,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rd(options: &[(&str, &str)]) -> ReadDatabase {
        ReadDatabase {
            connection: "shop".into(),
            options: strata_sql::string_map(options),
            location: strata_sql::Location::default(),
        }
    }

    #[test]
    fn options_are_checked_into_a_read() {
        let r = database_read(
            &rd(&[
                ("table", "public.orders"),
                ("watermark", "updated_at, id"),
                ("exclude", "blob"),
                ("overlap", "10 minutes"),
                ("batch_rows", "1000"),
                ("parallel", "3"),
            ]),
            "orders_raw",
        )
        .unwrap();
        let ReadMode::Watermark {
            columns,
            overlap,
            chunk,
            parallel,
            first_load,
        } = &r.mode
        else {
            panic!("not a watermark read");
        };
        assert_eq!(chunk, &ChunkSize::default());
        assert_eq!(first_load, &FirstLoad::Scan, "the default");
        assert_eq!(columns, &["updated_at", "id"]);
        assert_eq!(r.exclude, ["blob"]);
        assert_eq!(overlap, &Some(Overlap::Duration(Duration::from_secs(600))));
        assert_eq!(r.batch_rows, 1000);
        assert_eq!(parallel, &Some(3));
        assert_eq!(r.watermark_read().unwrap().parallel, Some(3));
        assert_eq!(
            r.object.label(),
            SourceObject::table("public.orders").unwrap().label()
        );
    }

    #[test]
    fn distinct_uuid_and_watermark_columns_are_written_plain_and_uuids_uncompressed() {
        use strata_sources::{ColumnKind, SourceColumn, SourceSchema};
        let column = |name: &str, source_type: &str| SourceColumn {
            name: name.into(),
            source_type: source_type.into(),
            kind: ColumnKind::Utf8,
            not_null: false,
            distinct: name == "code",
        };
        let described = SourceSchema {
            object: "public.orders".into(),
            columns: vec![
                column("id", "bigint"),
                column("ref", "uuid"),
                column("status", "text"),
                column("Updated_At", "timestamp with time zone"),
                column("code", "text"),
            ],
        };
        let watermark = database_read(
            &rd(&[("table", "public.orders"), ("watermark", "updated_at, id")]),
            "orders_raw",
        )
        .unwrap();
        let layout = watermark.column_layout(&described);
        assert_eq!(layout.plain, ["id", "ref", "Updated_At", "code"]);
        assert_eq!(layout.uncompressed, ["ref"]);
        assert_eq!(
            layout.properties().collect::<Vec<_>>(),
            [
                (
                    "strata.parquet.plainColumns",
                    "id,ref,Updated_At,code".to_string()
                ),
                ("strata.parquet.uncompressedColumns", "ref".to_string())
            ]
        );
        let cdc = database_read(
            &rd(&[("table", "public.orders"), ("mode", "cdc")]),
            "orders_raw",
        )
        .unwrap();
        assert_eq!(cdc.column_layout(&described).plain, ["ref", "code"]);
        let no_uuid = SourceSchema {
            object: "public.orders".into(),
            columns: vec![column("status", "text")],
        };
        assert_eq!(cdc.column_layout(&no_uuid).properties().count(), 0);
    }

    #[test]
    fn wrong_options_say_what_is_expected() {
        let e = |o: &[(&str, &str)]| database_read(&rd(o), "t").unwrap_err();
        assert!(e(&[("table", "t")]).contains("needs watermark"));
        assert!(e(&[("watermark", "w")]).contains("either table"));
        assert!(e(&[("table", "t"), ("query", "q"), ("watermark", "w")]).contains("either"));
        assert!(e(&[("table", "t"), ("watermark", "w"), ("colour", "red")]).contains("'colour'"));
        assert!(
            e(&[("table", "t"), ("watermark", "w"), ("first_load", "fast")])
                .contains("first_load 'fast' is not known: 'scan'")
        );
        let chunks = database_read(
            &rd(&[("table", "t"), ("watermark", "w"), ("first_load", "Chunks")]),
            "t",
        )
        .unwrap();
        assert!(matches!(
            chunks.mode,
            ReadMode::Watermark {
                first_load: FirstLoad::Chunks,
                ..
            }
        ));
        assert!(e(&[("table", "t"), ("mode", "cdc"), ("overlap", "5")])
            .contains("'overlap' is not known in cdc mode"));
        assert!(
            e(&[("table", "t"), ("watermark", "w"), ("batch_rows", "0")]).contains("batch_rows")
        );
        assert!(e(&[("mode", "cdc")]).contains("table =>"));
        assert!(e(&[("mode", "cdc"), ("table", "t"), ("watermark", "w")]).contains("cdc mode"));
        assert!(e(&[("mode", "log")]).contains("'log'"));
        assert!(e(&[("table", "t"), ("watermark", "w"), ("parallel", "0")]).contains("parallel"));
        assert!(e(&[("mode", "cdc"), ("table", "t"), ("parallel", "2")]).contains("cdc mode"));
    }

    #[test]
    fn chunk_sizes_are_rows_or_bytes() {
        let chunk = |o: &[(&str, &str)]| {
            let mut all = vec![("table", "t"), ("watermark", "w")];
            all.extend_from_slice(o);
            match database_read(&rd(&all), "t").map(|r| r.mode) {
                Ok(ReadMode::Watermark { chunk, .. }) => Ok(chunk),
                Ok(_) => panic!("not a watermark read"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(
            chunk(&[("chunk_rows", "1000")]).unwrap(),
            ChunkSize {
                rows: Some(1000),
                bytes: DEFAULT_CHUNK_BYTES
            }
        );
        assert_eq!(chunk(&[("chunk_bytes", "64MB")]).unwrap().bytes, 64 << 20);
        assert_eq!(chunk(&[("chunk_bytes", "1 GiB")]).unwrap().bytes, 1 << 30);
        assert_eq!(chunk(&[("chunk_bytes", "4096")]).unwrap().bytes, 4096);
        assert!(chunk(&[("chunk_bytes", "lots")])
            .unwrap_err()
            .contains("chunk_bytes"));
        assert!(chunk(&[("chunk_rows", "0")])
            .unwrap_err()
            .contains("chunk_rows"));
        let c = ChunkSize {
            rows: Some(10),
            bytes: 100,
        };
        assert!(!c.full(9, 99) && c.full(10, 0) && c.full(0, 100));
    }

    #[test]
    fn cdc_reads_name_their_slot_after_the_table() {
        let r = database_read(
            &rd(&[("mode", "cdc"), ("table", "public.orders")]),
            "default.Orders-Raw",
        )
        .unwrap();
        let ReadMode::Changes {
            slot, publication, ..
        } = &r.mode
        else {
            panic!("not cdc");
        };
        assert_eq!(slot, "strata_default_orders_raw");
        assert_eq!(publication, slot);
        assert!(matches!(
            r.mode,
            ReadMode::Changes { chunk_rows, .. } if chunk_rows == DEFAULT_CDC_CHUNK_ROWS
        ));
        let cdc = |v: &str| {
            database_read(
                &rd(&[
                    ("mode", "cdc"),
                    ("table", "public.orders"),
                    ("chunk_rows", v),
                ]),
                "t",
            )
            .map(|r| r.mode)
        };
        assert!(matches!(
            cdc("1000"),
            Ok(ReadMode::Changes {
                chunk_rows: 1000,
                ..
            })
        ));
        assert!(cdc("none").unwrap_err().contains("chunk_rows"));
        assert!(matches!(
            r.mode,
            ReadMode::Changes {
                first_load: FirstLoad::Chunks,
                ..
            }
        ));
        let scan = database_read(
            &rd(&[("mode", "cdc"), ("table", "t"), ("first_load", "scan")]),
            "t",
        )
        .unwrap();
        assert!(matches!(
            scan.mode,
            ReadMode::Changes {
                first_load: FirstLoad::Scan,
                ..
            }
        ));
        assert_eq!(r.cdc_config().unwrap().tables[0].table.name, "orders");
        assert_eq!(default_slot_name(&"x".repeat(100)).len(), 63);
    }

    #[test]
    fn overlaps_are_amounts_or_durations() {
        assert_eq!(parse_overlap("500"), Ok(Overlap::Amount(500)));
        assert_eq!(
            parse_overlap("2 hours"),
            Ok(Overlap::Duration(Duration::from_secs(7200)))
        );
        assert_eq!(
            parse_overlap("1 day"),
            Ok(Overlap::Duration(Duration::from_secs(86_400)))
        );
        assert!(parse_overlap("-1").is_err());
        assert!(parse_overlap("10 fortnights").is_err());
        assert!(parse_overlap("").is_err());
    }
}
