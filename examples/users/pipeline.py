# The example of the Databricks AUTO CDC documentation in Lakeflow's Python API, run by strata
# (`strata run examples/users/pipeline.py`, or strata.run("examples/users/pipeline.py")).
# Changed from the documentation: the import line, and the source (the documentation reads
# a table with spark.readStream; here the change events come from the JSON files under
# data/cdc). It writes the same tables as pipeline.sql beside it.
from strata import pipelines as dp
from strata.pipelines import col, expr


# Bronze: every change event, as delivered. (A view over a stream, as in the
# documentation; strata keeps it as a streaming table: see docs/python.md.)
@dp.view(comment="Raw change events, one row per event")
def users_cdc():
    return dp.read_files(
        "data/cdc", format="json",
        schema="userId INT, name STRING, city STRING, operation STRING, sequenceNum INT")


# Silver: the full history of each user (SCD type 2).
dp.create_streaming_table("users")

dp.create_auto_cdc_flow(
    target="users",
    source="users_cdc",
    keys=["userId"],
    sequence_by=col("sequenceNum"),
    apply_as_deletes=expr("operation = 'DELETE'"),
    except_column_list=["operation", "sequenceNum"],
    stored_as_scd_type=2,
)
