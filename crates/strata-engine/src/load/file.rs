//! A pipeline in one SQL file: read, configuration substituted, parsed and planned.

use crate::error::{Context, EngineError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use strata_sql::PipelinePlan;

/// Parses and plans the pipeline in `path` without running anything.
pub fn plan_file(
    path: &Path,
    configuration: &BTreeMap<String, String>,
    catalog: &str,
) -> Result<(PipelinePlan, PathBuf)> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).context(|| format!("cannot read {file}"))?;
    let pipeline_error = |source| EngineError::Pipeline {
        file: file.clone(),
        source: Box::new(source),
    };
    let text = strata_sql::substitute(&text, configuration).map_err(pipeline_error)?;
    let text = crate::load::sources::in_catalog(text, catalog)?;
    let pipeline_dir = std::fs::canonicalize(path)
        .context(|| format!("cannot resolve {file}"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let parsed = strata_sql::parse_pipeline(&text).map_err(pipeline_error)?;
    let plan = strata_sql::plan_pipeline(parsed).map_err(pipeline_error)?;
    Ok((plan, pipeline_dir))
}
