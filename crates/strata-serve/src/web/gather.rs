//! Gathering what the pages show (I/O): the event log's last runs, each pipeline's plan,
//! the warehouse's tables, a table's metadata and rows, all through the engine.

use super::model::{self, Grid, Overview, OverviewInput, TablePage};
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::collections::BTreeMap;
use strata_engine::{DatasetGraph, EngineError, Warehouse};

/// How many runs (of every pipeline) the overview reads from the event log.
const RUNS_READ: usize = 50;

/// Why a page could not be built.
#[derive(Debug)]
pub enum PageError {
    /// No such table in the warehouse.
    NotFound(String),
    /// Reading the warehouse failed.
    Engine(String),
}

impl From<EngineError> for PageError {
    fn from(e: EngineError) -> Self {
        PageError::Engine(strata_engine::chain(&e))
    }
}

/// The overview page's model.
pub async fn read_overview(wh: &Warehouse) -> Result<Overview, PageError> {
    let events = match strata_engine::read_events(wh, RUNS_READ, None).await? {
        Some((_, batches)) => strata_engine::logged_events(&batches)?,
        None => Vec::new(),
    };
    let mut graphs = BTreeMap::new();
    for e in &events {
        if !graphs.contains_key(&e.pipeline) {
            graphs.insert(e.pipeline.clone(), plan_graph(&e.pipeline, wh.catalog()));
        }
    }
    Ok(model::overview(OverviewInput {
        warehouse: wh.root().to_string(),
        event_log_version: strata_engine::event_log_version(wh).await?,
        events,
        graphs,
        tables: table_names(wh).await?,
    }))
}

/// The dataset graph of the pipeline at `path` (as `strata run` was given it, read from
/// this process's folder), or why it cannot be planned here.
fn plan_graph(path: &str, catalog: &str) -> Result<DatasetGraph, String> {
    let path = std::path::Path::new(path);
    let planned = strata_engine::load_pipeline(path, &BTreeMap::new()).and_then(|loaded| {
        strata_engine::plan_sources(
            &loaded.sources,
            &loaded.configuration,
            &loaded.schema,
            loaded.catalog.as_deref().unwrap_or(catalog),
        )
    });
    match planned {
        Ok(planned) => Ok(DatasetGraph::of(&planned.steps())),
        Err(e) => Err(format!(
            "the graph shows the datasets the event log names, without their inputs: the \
             pipeline cannot be planned here ({})",
            strata_engine::chain(&e)
        )),
    }
}

/// Every table of the warehouse as `schema.name`.
async fn table_names(wh: &Warehouse) -> Result<Vec<String>, PageError> {
    Ok(wh
        .list_tables()
        .await?
        .iter()
        .map(|t| t.to_string())
        .collect())
}

/// The page of table `name` (`schema.name`, or a name in the default schema).
pub async fn read_table(wh: &Warehouse, name: &str) -> Result<TablePage, PageError> {
    let tables = wh.list_tables().await?;
    let Some(table) = tables
        .iter()
        .find(|t| t.to_string() == name || (t.schema == "default" && t.name == name))
    else {
        return Err(PageError::NotFound(format!(
            "no table {name} in the warehouse {}",
            wh.root()
        )));
    };
    // A name the warehouse listed, quoted: nothing of the request reaches the SQL text.
    let quoted = format!("{}.{}", quote(&table.schema), quote(&table.name));
    let columns = grid(&query(wh, &format!("DESCRIBE {quoted}")).await?)?;
    let count = grid(&query(wh, &format!("SELECT count(*) AS n FROM {quoted}")).await?)?;
    let row_count = count
        .rows
        .first()
        .and_then(|r| r.first())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let history = grid(&query(wh, &format!("DESCRIBE HISTORY {quoted}")).await?)?.select(
        &[
            "version",
            "timestamp",
            "operation",
            "operationParameters",
            "operationMetrics",
        ],
        model::HISTORY_SHOWN,
    );
    let sample = grid(
        &query(
            wh,
            &format!("SELECT * FROM {quoted} LIMIT {}", model::SAMPLE_ROWS),
        )
        .await?,
    )?;
    Ok(TablePage {
        name: table.to_string(),
        columns,
        row_count,
        history,
        sample,
    })
}

fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

async fn query(
    wh: &Warehouse,
    sql: &str,
) -> Result<(deltalake::arrow::datatypes::SchemaRef, Vec<RecordBatch>), PageError> {
    Ok(strata_engine::query(wh, sql).await?)
}

/// Query results as text, nulls as `NULL`.
pub fn grid(
    (schema, batches): &(deltalake::arrow::datatypes::SchemaRef, Vec<RecordBatch>),
) -> Result<Grid, PageError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PageError::Engine(format!("showing a value: {e}")))?;
        for i in 0..b.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(i).to_string()).collect());
        }
    }
    Ok(Grid {
        columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn a_grid_holds_every_batchs_rows_as_text_with_nulls_named() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = |ids: Vec<Option<i64>>, names: Vec<Option<&str>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(names)),
                ],
            )
            .unwrap()
        };
        let g = grid(&(
            schema.clone(),
            vec![
                batch(vec![Some(1)], vec![Some("<b>")]),
                batch(vec![None], vec![None]),
            ],
        ))
        .unwrap();
        assert_eq!(g.columns, ["id", "name"]);
        assert_eq!(g.rows, [["1", "<b>"], ["NULL", "NULL"]]);
    }

    #[test]
    fn identifiers_are_quoted_whole() {
        assert_eq!(quote("users"), "\"users\"");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
