"""The music-streaming pipeline of pipeline.sql, in Lakeflow's Python API: the same datasets,
flows and expectations, rendered by strata into the same SQL (python/tests checks that both
give identical tables). Run it with `strata run pipeline.py` or strata.run("pipeline.py").

Bronze: the files of incoming/<entity>/ as delivered (each run takes only the new files).
Silver: cleaned rows; expectations drop what cannot be used and count what looks wrong.
Gold:   SCD type 2 dimensions sequenced by the source's updated_at, SCD type 1 for the rest.
Views:  hours per month and plan under the plan valid when each play started (point-in-time
        join), next to the naive join on user_id.
"""
from strata import pipelines as dp
from strata.pipelines import col

# ------------------------------------------------------------------------------------ bronze


@dp.table(comment="Account change records, one per line, as exported by the account system")
def bronze_users():
    return dp.read_files(
        "incoming/users", format="json",
        schema="user_id INT, name STRING, country STRING, plan STRING, op STRING, "
               "updated_at TIMESTAMP")


@dp.table(comment="Artist records from the catalogue")
def bronze_artists():
    return dp.read_files("incoming/artists", format="csv", header=True,
                         schema="artist_id INT, name STRING, country STRING, updated_at TIMESTAMP")


@dp.table(comment="Track records from the catalogue: new tracks, genre reclassifications, "
                  "re-releases")
def bronze_tracks():
    return dp.read_files(
        "incoming/tracks", format="csv", header=True,
        schema="track_id INT, artist_id INT, title STRING, genre STRING, duration_ms INT, "
               "updated_at TIMESTAMP")


@dp.table(comment="Play reports from the clients; a correction repeats stream_id with a later "
                  "updated_at")
def bronze_streams():
    return dp.read_files(
        "incoming/streams", format="csv", header=True,
        schema="stream_id BIGINT, user_id INT, track_id INT, started_at TIMESTAMP, "
               "ms_played BIGINT, updated_at TIMESTAMP")

# ------------------------------------------------------------------------------------ silver


@dp.table(comment="Account changes with a user_id, plan names normalised (an unknown plan is "
                  "kept and counted)")
@dp.expect_or_drop("valid_user_id", "user_id IS NOT NULL")
@dp.expect("known_plan", "op = 'DELETE' OR plan IN ('free', 'premium', 'family')")
@dp.expect_or_fail("known_op", col("op").isin("UPSERT", "DELETE"))
@dp.expect_or_fail("valid_updated_at", "updated_at > TIMESTAMP '2000-01-01 00:00:00'")
def silver_users():
    return dp.stream("bronze_users").selectExpr(
        "user_id", "trim(name) AS name", "upper(trim(country)) AS country",
        "lower(trim(plan)) AS plan", "op", "updated_at")


@dp.table(comment="Track records that can be played")
@dp.expect_all_or_fail({"valid_track_id": "track_id IS NOT NULL AND updated_at IS NOT NULL"})
@dp.expect_all_or_drop({"positive_duration": "duration_ms > 0"})
def silver_tracks():
    return dp.stream("bronze_tracks").selectExpr(
        "track_id", "artist_id", "trim(title) AS title", "lower(trim(genre)) AS genre",
        "duration_ms", "updated_at")


@dp.table(comment="Play reports with a user and a non-negative duration")
@dp.expect_or_fail("valid_stream",
                   "stream_id IS NOT NULL AND started_at IS NOT NULL AND updated_at IS NOT NULL")
@dp.expect_all_or_drop({"valid_user_id": "user_id IS NOT NULL",
                        "valid_ms_played": "ms_played >= 0"})
@dp.expect("in_service_period", "started_at >= TIMESTAMP '2025-01-01 00:00:00'")
def silver_streams():
    return dp.stream("bronze_streams").select(
        "stream_id", "user_id", "track_id", "started_at", "ms_played", "updated_at")

# -------------------------------------------------------------------------------------- gold


dp.create_streaming_table(
    "dim_user",
    comment="Every version of every account (SCD type 2): valid from __START_AT to __END_AT")
dp.create_auto_cdc_flow(target="dim_user", source="silver_users", keys=["user_id"],
                        apply_as_deletes="op = 'DELETE'", sequence_by=col("updated_at"),
                        except_column_list=["op", "updated_at"], stored_as_scd_type=2)

dp.create_streaming_table(
    "dim_track",
    comment="Every version of every track (SCD type 2): genre and title as they were at each "
            "time")
dp.create_auto_cdc_flow(target="dim_track", source="silver_tracks", keys=["track_id"],
                        sequence_by="updated_at", except_column_list=["updated_at"],
                        stored_as_scd_type=2)

dp.create_streaming_table("dim_artist", comment="The latest record of each artist (SCD type 1)")
dp.create_auto_cdc_flow(target="dim_artist", source="bronze_artists", keys=["artist_id"],
                        sequence_by="updated_at", stored_as_scd_type=1)

dp.create_streaming_table(
    "fact_stream",
    comment="One row per play, its latest report (SCD type 1): corrections replace, "
            "redeliveries collapse")
dp.create_auto_cdc_flow(target="fact_stream", source="silver_streams", keys=["stream_id"],
                        sequence_by="updated_at", stored_as_scd_type=1)

# ------------------------------------------------------------------------------------- views

HOURS = """SELECT CAST(date_trunc('month', s.started_at) AS DATE) AS month,
          {dim}.{attr},
          count(*) AS streams,
          round(sum(s.ms_played) / 3600000.0, 2) AS hours
FROM fact_stream s
JOIN {table} {dim}
  ON {dim}.{key} = s.{key}{pit}
GROUP BY CAST(date_trunc('month', s.started_at) AS DATE), {dim}.{attr}"""


def valid_at_start(dim):
    return (f"\n AND s.started_at >= {dim}.__START_AT"
            f"\n AND ({dim}.__END_AT IS NULL OR s.started_at < {dim}.__END_AT)")


@dp.materialized_view(comment="Hours streamed per month and plan, each play under the plan its "
                              "user had when it started")
def plan_hours_by_month():
    # Point-in-time join: a play counts under the version of its user valid when it started.
    return HOURS.format(dim="u", attr="plan", table="dim_user", key="user_id",
                        pit=valid_at_start("u"))


@dp.materialized_view(comment="The same numbers from a join on user_id only (wrong: counts a "
                              "play once per version of its user)")
def plan_hours_by_month_naive():
    return HOURS.format(dim="u", attr="plan", table="dim_user", key="user_id", pit="")


@dp.materialized_view(comment="Hours streamed per month and genre (genre valid at the start of "
                              "each play)")
def genre_hours_by_month():
    return HOURS.format(dim="t", attr="genre", table="dim_track", key="track_id",
                        pit=valid_at_start("t"))
