//! The plan codecs of strata's cluster processes: Ballista's, and strata's fold-and-write
//! nodes (`strata_engine::cluster`), which encode themselves.

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::catalog::TableProvider;
use deltalake::datafusion::common::{Result, TableReference};
use deltalake::datafusion::datasource::file_format::FileFormatFactory;
use deltalake::datafusion::execution::TaskContext;
use deltalake::datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use deltalake::datafusion::physical_plan::ExecutionPlan;
use std::sync::Arc;
use strata_engine::cluster::{FoldWriteExec, FoldWriteNode};

/// Ballista's logical codec, and [`FoldWriteNode`].
#[derive(Debug, Default)]
pub struct LogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        if let [input] = inputs {
            if let Some(node) = FoldWriteNode::from_bytes(buf, input.clone()) {
                return Ok(Extension {
                    node: Arc::new(node?),
                });
            }
        }
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match node.node.as_any().downcast_ref::<FoldWriteNode>() {
            Some(fold) => {
                buf.extend(fold.to_bytes());
                Ok(())
            }
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        self.inner
            .try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }
}

/// Ballista's physical codec, and [`FoldWriteExec`].
#[derive(Debug, Default)]
pub struct PhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let [input] = inputs {
            if let Some(exec) = FoldWriteExec::from_bytes(buf, input.clone()) {
                return Ok(Arc::new(exec?));
            }
        }
        self.inner.try_decode(buf, inputs, ctx, converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match node.downcast_ref::<FoldWriteExec>() {
            Some(fold) => {
                buf.extend(fold.to_bytes());
                Ok(())
            }
            None => self.inner.try_encode(node, buf, converter),
        }
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }
}
