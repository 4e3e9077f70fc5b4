//! `validate` of a point-in-time table: its rows computed again from its historised tables
//! over its own as-of values (the same query a refresh runs), compared with what it holds.
//! Every row must point at the versions valid at its as-of value, and every version valid
//! at an as-of value the table holds must have its row.

use crate::error::{Context, EngineError, Result};
use crate::semantics::integrity::Violation;
use crate::semantics::pit::{pit_source, pit_sql, pit_violations, PitRow, Ranges, AS_OF_COL};
use crate::semantics::timeline::Timeline;
use crate::storage::session::{new_session, register_table};
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::prelude::SessionContext;
use std::collections::HashMap;
use strata_sql::TableName;

/// The violations of PIT table `table` (named `table_name` in messages) with properties
/// `config` (its keys and sources, `semantics::pit`).
pub(crate) async fn validate_pit(
    wh: &Warehouse,
    table: &deltalake::DeltaTable,
    table_name: &str,
    config: &HashMap<String, String>,
) -> Result<Vec<Violation>> {
    let list = |key: &str| -> Vec<String> {
        config
            .get(key)
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    };
    let keys = list(crate::semantics::pit::KEYS_PROPERTY);
    let ctx = new_session();
    register_table(&ctx, "__strata_pit", table, None).await?;
    let mut sources = Vec::new();
    for (i, name) in list(crate::semantics::pit::SOURCES_PROPERTY)
        .iter()
        .enumerate()
    {
        let name =
            TableName::parse(name, TableName::DEFAULT_SCHEMA).map_err(EngineError::NotFound)?;
        let source = wh.open_table(&name).await?.ok_or_else(|| {
            EngineError::NotFound(format!(
                "point-in-time table {table_name} reads {name}, which is not in the warehouse"
            ))
        })?;
        let props = crate::storage::table::table_properties(&source)?;
        let reference = format!("__strata_source_{i}");
        register_table(&ctx, &reference, &source, None).await?;
        sources.push(pit_source(
            reference,
            &name.name,
            &Timeline::from_properties(&props)?,
            props.get("strata.scdType").map(String::as_str) == Some("snapshots"),
        ));
    }
    let spine = ctx
        .sql(&format!("SELECT DISTINCT {AS_OF_COL} FROM __strata_pit"))
        .await
        .context(|| format!("validate {table_name}"))?;
    ctx.register_table("__strata_spine", spine.into_view())
        .context(|| format!("validate {table_name}"))?;
    let expected = ctx
        .sql(&pit_sql(&keys, &sources, Ranges::Joined))
        .await
        .context(|| format!("validate {table_name}: computing its rows again"))?;
    ctx.register_table("__strata_expected", expected.into_view())
        .context(|| format!("validate {table_name}"))?;
    let key_cols: Vec<String> = std::iter::once(AS_OF_COL.to_string())
        .chain(keys.iter().cloned())
        .collect();
    let out_cols: Vec<String> = sources.iter().map(|s| s.out_name.clone()).collect();
    let cols = key_cols
        .iter()
        .chain(&out_cols)
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let difference =
        |a: &str, b: &str| format!("SELECT {cols} FROM {a} EXCEPT SELECT {cols} FROM {b}");
    let unexpected = rows(
        &ctx,
        &difference("__strata_pit", "__strata_expected"),
        &key_cols,
        &out_cols,
    )
    .await?;
    let missing = rows(
        &ctx,
        &difference("__strata_expected", "__strata_pit"),
        &key_cols,
        &out_cols,
    )
    .await?;
    let grouped = key_cols
        .iter()
        .map(|c| quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let duplicated: Vec<(String, i64)> = rows(
        &ctx,
        &format!(
            "SELECT {grouped}, count(*) AS n FROM __strata_pit GROUP BY {grouped} HAVING count(*) > 1"
        ),
        &key_cols,
        &["n".to_string()],
    )
    .await?
    .into_iter()
    .map(|r| {
        let n = r.points_at.trim_start_matches("n=").parse().unwrap_or(0);
        (r.key, n)
    })
    .collect();
    Ok(pit_violations(&unexpected, &missing, &duplicated))
}

/// The rows `sql` selects, each as its key (`as_of=3, id=1`) and what it points at.
async fn rows(
    ctx: &SessionContext,
    sql: &str,
    key_cols: &[String],
    out_cols: &[String],
) -> Result<Vec<PitRow>> {
    let batches = collect(ctx, sql).await?;
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in &batches {
        let f: Vec<ArrayFormatter> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<_, _>>()
            .context(|| "validate: formatting rows".into())?;
        let named = |names: &[String], offset: usize, r: usize| {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{n}={}", f[offset + i].value(r)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for r in 0..b.num_rows() {
            out.push(PitRow {
                key: named(key_cols, 0, r),
                points_at: named(out_cols, key_cols.len(), r),
            });
        }
    }
    out.sort();
    Ok(out)
}

async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    ctx.sql(sql)
        .await
        .context(|| "validate".into())?
        .collect()
        .await
        .context(|| "validate".into())
}
