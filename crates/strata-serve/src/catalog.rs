//! What PostgreSQL clients ask of a server besides the warehouse's tables: `version()`,
//! `current_database()`, `current_schema()`, and a small `pg_catalog` (`pg_namespace`,
//! `pg_class`, `pg_attribute`, `pg_type`, `pg_am`, `pg_database`, `pg_table_is_visible`,
//! `pg_get_userbyid`, `format_type`, and the names behind `::regclass` and `::regnamespace`)
//! enough for psql's `\dt` and `\d TABLE` and clients that list schemas, tables and
//! columns (with `pg_syntax` adapting the queries). `information_schema` is DataFusion's.

use crate::types::{pg_type, type_size};
use deltalake::arrow::array::{ArrayRef, BooleanArray, Int32Array, RecordBatch, StringArray};
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use deltalake::datafusion::datasource::MemTable;
use deltalake::datafusion::error::Result;
use deltalake::datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::datafusion::scalar::ScalarValue;
use pgwire::api::Type;
use std::collections::HashMap;
use std::sync::Arc;

/// The catalog DataFusion knows the warehouse by.
pub(crate) const REGISTERED_CATALOG: &str = "strata";

/// The schema the PostgreSQL catalog tables are in.
const PG_CATALOG: &str = "pg_catalog";

/// The version string `SELECT version()` returns (clients parse its first two words).
pub(crate) fn version() -> String {
    format!(
        "PostgreSQL 16.6 (strata {}, read-only)",
        env!("CARGO_PKG_VERSION")
    )
}

/// What a connection's catalog functions answer.
pub(crate) struct Names<'a> {
    /// The warehouse's catalog name (`main`): the database.
    pub database: &'a str,
    /// The schema of unqualified names.
    pub schema: &'a str,
    /// The user the client logged in as.
    pub user: &'a str,
}

/// Registers the functions in `ctx` (a session of the warehouse), and the `pg_catalog`
/// schema listing the tables `ctx` has registered when `sql` names it (listing them reads
/// each table's schema: a point lookup need not pay for it).
pub(crate) async fn register(ctx: &SessionContext, names: &Names<'_>, sql: &str) -> Result<()> {
    let constant = |name: &str, value: String, aliases: &[&'static str]| {
        let f = create_udf(
            name,
            vec![],
            DataType::Utf8,
            Volatility::Stable,
            Arc::new(move |_: &[ColumnarValue]| {
                Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                    value.clone(),
                ))))
            }),
        );
        ctx.register_udf(f.with_aliases(aliases.iter().copied()));
    };
    constant("version", version(), &["pg_catalog.version"]);
    constant(
        "current_database",
        names.database.to_string(),
        &["pg_catalog.current_database"],
    );
    constant(
        "current_schema",
        names.schema.to_string(),
        &["pg_catalog.current_schema"],
    );
    let user = names.user.to_string();
    ctx.register_udf(
        create_udf(
            "pg_get_userbyid",
            vec![DataType::Int32],
            DataType::Utf8,
            Volatility::Stable,
            Arc::new(move |_: &[ColumnarValue]| {
                Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(user.clone()))))
            }),
        )
        .with_aliases(["pg_catalog.pg_get_userbyid"]),
    );
    ctx.register_udf(
        create_udf(
            "pg_table_is_visible",
            vec![DataType::Int32],
            DataType::Boolean,
            Volatility::Stable,
            Arc::new(|_: &[ColumnarValue]| {
                Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
            }),
        )
        .with_aliases(["pg_catalog.pg_table_is_visible"]),
    );
    ctx.register_udf(
        create_udf(
            "format_type",
            vec![DataType::Int32, DataType::Int32],
            DataType::Utf8,
            Volatility::Immutable,
            Arc::new(|args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let oids = as_int32(&arrays[0])?;
                let modifiers = as_int32(&arrays[1])?;
                let names: StringArray = oids
                    .iter()
                    .zip(modifiers.iter())
                    .map(|(oid, modifier)| oid.map(|o| format_type(o, modifier.unwrap_or(-1))))
                    .collect();
                Ok(ColumnarValue::Array(Arc::new(names)))
            }),
        )
        .with_aliases(["pg_catalog.format_type"]),
    );
    if !names_pg_catalog(sql) {
        return Ok(());
    }
    let Some(catalog) = ctx.catalog(REGISTERED_CATALOG) else {
        return Ok(());
    };
    let mut schemas: Vec<String> = catalog
        .schema_names()
        .into_iter()
        .filter(|s| s != PG_CATALOG)
        .collect();
    schemas.sort();
    let mut tables = Vec::new();
    for schema in &schemas {
        if schema == "information_schema" {
            continue;
        }
        if let Some(provider) = catalog.schema(schema) {
            let mut names = provider.table_names();
            names.sort();
            for name in names {
                let columns = match provider.table(&name).await? {
                    Some(t) => t.schema(),
                    None => continue,
                };
                tables.push((schema.clone(), name, columns));
            }
        }
    }
    let pg = Arc::new(MemorySchemaProvider::new());
    let all_schemas: Vec<String> = schemas
        .iter()
        .cloned()
        .chain([PG_CATALOG.to_string()])
        .collect();
    let namespace_oid = |s: &str| {
        all_schemas
            .iter()
            .position(|n| n == s)
            .map_or(0, |i| 2200 + i as i32)
    };
    register_oid_names(
        ctx,
        "strata_regclass",
        (0..tables.len())
            .map(|i| (16384 + i as i32, tables[i].1.clone()))
            .collect(),
    );
    register_oid_names(
        ctx,
        "strata_regnamespace",
        all_schemas
            .iter()
            .map(|s| (namespace_oid(s), s.clone()))
            .collect(),
    );
    pg.register_table(
        "pg_namespace".into(),
        table(vec![
            ("oid", int(all_schemas.iter().map(|s| namespace_oid(s)))),
            ("nspname", text(all_schemas.iter().cloned())),
            ("nspowner", int(all_schemas.iter().map(|_| 10))),
        ])?,
    )?;
    pg.register_table(
        "pg_class".into(),
        table(vec![
            ("oid", int((0..tables.len()).map(|i| 16384 + i as i32))),
            ("relname", text(tables.iter().map(|(_, t, _)| t.clone()))),
            (
                "relnamespace",
                int(tables.iter().map(|(s, ..)| namespace_oid(s))),
            ),
            ("relkind", text(tables.iter().map(|_| "r".to_string()))),
            ("relowner", int(tables.iter().map(|_| 10))),
            ("relam", int(tables.iter().map(|_| 2))),
            ("relchecks", int(tables.iter().map(|_| 0))),
            ("relhasindex", boolean(tables.iter().map(|_| false))),
            ("relhasrules", boolean(tables.iter().map(|_| false))),
            ("relhastriggers", boolean(tables.iter().map(|_| false))),
            ("relrowsecurity", boolean(tables.iter().map(|_| false))),
            ("relforcerowsecurity", boolean(tables.iter().map(|_| false))),
            ("relispartition", boolean(tables.iter().map(|_| false))),
            ("reltablespace", int(tables.iter().map(|_| 0))),
            ("reloftype", int(tables.iter().map(|_| 0))),
            ("reltoastrelid", int(tables.iter().map(|_| 0))),
            (
                "relpersistence",
                text(tables.iter().map(|_| "p".to_string())),
            ),
            ("relreplident", text(tables.iter().map(|_| "n".to_string()))),
        ])?,
    )?;
    // Each table's columns, with their PostgreSQL types.
    let columns: Vec<(i32, i32, &Field)> = tables
        .iter()
        .enumerate()
        .flat_map(|(i, (_, _, schema))| {
            schema
                .fields()
                .iter()
                .enumerate()
                .map(move |(n, f)| (16384 + i as i32, n as i32 + 1, f.as_ref()))
        })
        .collect();
    let column_type = |f: &Field| pg_type(f.data_type());
    pg.register_table(
        "pg_attribute".into(),
        table(vec![
            ("attrelid", int(columns.iter().map(|c| c.0))),
            ("attname", text(columns.iter().map(|c| c.2.name().clone()))),
            (
                "atttypid",
                int(columns.iter().map(|c| column_type(c.2).0.oid() as i32)),
            ),
            ("attnum", int(columns.iter().map(|c| c.1))),
            (
                "attlen",
                int(columns
                    .iter()
                    .map(|c| i32::from(type_size(&column_type(c.2).0)))),
            ),
            ("atttypmod", int(columns.iter().map(|c| column_type(c.2).1))),
            (
                "attnotnull",
                boolean(columns.iter().map(|c| !c.2.is_nullable())),
            ),
            ("attisdropped", boolean(columns.iter().map(|_| false))),
            ("atthasdef", boolean(columns.iter().map(|_| false))),
            ("attidentity", text(columns.iter().map(|_| String::new()))),
            ("attgenerated", text(columns.iter().map(|_| String::new()))),
            ("attcollation", int(columns.iter().map(|_| 0))),
        ])?,
    )?;
    let types = [
        Type::BOOL,
        Type::BYTEA,
        Type::INT8,
        Type::INT2,
        Type::INT4,
        Type::TEXT,
        Type::JSON,
        Type::FLOAT4,
        Type::FLOAT8,
        Type::DATE,
        Type::TIME,
        Type::TIMESTAMP,
        Type::TIMESTAMPTZ,
        Type::NUMERIC,
    ];
    let pg_catalog_oid = namespace_oid(PG_CATALOG);
    pg.register_table(
        "pg_type".into(),
        table(vec![
            ("oid", int(types.iter().map(|t| t.oid() as i32))),
            ("typname", text(types.iter().map(|t| t.name().to_string()))),
            ("typnamespace", int(types.iter().map(|_| pg_catalog_oid))),
            ("typlen", int(types.iter().map(|t| i32::from(type_size(t))))),
            ("typtype", text(types.iter().map(|_| "b".to_string()))),
            ("typcollation", int(types.iter().map(|_| 0))),
        ])?,
    )?;
    pg.register_table(
        "pg_am".into(),
        table(vec![
            ("oid", int([2])),
            ("amname", text(["delta".to_string()])),
        ])?,
    )?;
    pg.register_table(
        "pg_database".into(),
        table(vec![
            ("oid", int([1])),
            ("datname", text([names.database.to_string()])),
        ])?,
    )?;
    catalog.register_schema(PG_CATALOG, pg as Arc<dyn SchemaProvider>)?;
    Ok(())
}

/// Whether `sql` reads the `pg_catalog` schema (which is only reachable by that name).
fn names_pg_catalog(sql: &str) -> bool {
    sql.to_ascii_lowercase().contains("pg_catalog")
}

/// `name(oid)`: the name `names` gives `oid` (the oid's digits for an unknown one, as
/// PostgreSQL prints an object identifier it cannot name).
fn register_oid_names(ctx: &SessionContext, name: &str, names: HashMap<i32, String>) {
    ctx.register_udf(create_udf(
        name,
        vec![DataType::Int32],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let out: StringArray = as_int32(&arrays[0])?
                .iter()
                .map(|oid| oid.map(|o| names.get(&o).cloned().unwrap_or_else(|| o.to_string())))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    ));
}

/// PostgreSQL's `format_type(oid, typmod)` for the types the server sends: SQL's names,
/// with the precision and scale of a numeric.
pub(crate) fn format_type(oid: i32, modifier: i32) -> String {
    let Some(t) = u32::try_from(oid).ok().and_then(Type::from_oid) else {
        return "???".to_string();
    };
    match t {
        Type::BOOL => "boolean".into(),
        Type::INT2 => "smallint".into(),
        Type::INT4 => "integer".into(),
        Type::INT8 => "bigint".into(),
        Type::FLOAT4 => "real".into(),
        Type::FLOAT8 => "double precision".into(),
        Type::DATE => "date".into(),
        Type::TIME => "time without time zone".into(),
        Type::TIMESTAMP => "timestamp without time zone".into(),
        Type::TIMESTAMPTZ => "timestamp with time zone".into(),
        Type::NUMERIC if modifier >= 4 => {
            let m = modifier - 4;
            format!("numeric({},{})", (m >> 16) & 0xffff, m & 0xffff)
        }
        t => t.name().to_string(),
    }
}

/// `array` as 32-bit integers (the catalog functions' arguments), casting other integers.
fn as_int32(array: &ArrayRef) -> Result<Int32Array> {
    let cast = deltalake::arrow::compute::cast(array, &DataType::Int32)?;
    Ok(cast
        .as_any()
        .downcast_ref::<Int32Array>()
        .cloned()
        .unwrap_or_else(|| Int32Array::new_null(cast.len())))
}

fn int(values: impl IntoIterator<Item = i32>) -> ArrayRef {
    Arc::new(Int32Array::from_iter_values(values))
}

fn boolean(values: impl IntoIterator<Item = bool>) -> ArrayRef {
    Arc::new(BooleanArray::from_iter(values.into_iter().map(Some)))
}

fn text(values: impl IntoIterator<Item = String>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

/// A table of `columns` (all NOT NULL).
fn table(columns: Vec<(&str, ArrayRef)>) -> Result<Arc<MemTable>> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}
