//! # strata-sql: the pipeline dialect
//!
//! Turns pipeline text written in the Databricks Lakeflow SQL dialect into a validated
//! [`PipelinePlan`]:
//!
//! ```text
//!   pipeline.sql ──parse_pipeline──▶ Pipeline (ast.rs) ──plan_pipeline──▶ PipelinePlan (plan.rs)
//!                  Spark lexical rules,                   dataset graph: unknown tables,
//!                  errors with line:column               cycles, contradictory flow options,
//!                                                        each node's reads and writes,
//!                                                        names matched without regard
//!                                                        to case (names.rs)
//! ```
//!
//! Tokenising uses DataFusion's re-exported `sqlparser`. Spark's lexical rules are applied on
//! the token stream (a double-quoted token is a string literal, backticks quote identifiers,
//! `--` and `/* */` comments, keywords in any case), so expressions handed on to the engine
//! are plain SQL that DataFusion's default dialect accepts.
//!
//! This crate does no I/O and knows nothing of schemas of data: checks that need a schema
//! (unknown columns, reserved names) are the engine's.

pub mod ast;
mod config;
mod datetime;
mod error;
mod lex;
mod names;
mod parser;
mod plan;
mod types;

pub use ast::*;
#[doc(hidden)]
pub use config::string_map;
pub use config::substitute;
pub use datetime::spark_datetime_pattern;
pub use error::{Result, SqlError};
pub use parser::{parse_pipeline, parse_pipeline_in, TABLE_MODE_VERSION_SQL};
pub use plan::{plan_pipeline, Node, PipelinePlan};
pub use types::{parse_ddl_schema, sql_type_name};
