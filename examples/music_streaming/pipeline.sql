-- A music-streaming service: accounts whose plans change over time, artists, tracks and plays.
--
-- Bronze: the files of incoming/<entity>/ as delivered (each run takes only the new files).
-- Silver: cleaned rows; expectations drop what cannot be used and count what looks wrong.
-- Gold:   dim_user and dim_track keep every version (SCD type 2, sequenced by the source's
--         updated_at, so late records land where they belong), dim_artist and fact_stream keep
--         the latest version (SCD type 1: a corrected play replaces the first report).
-- Views:  hours per month and plan, each play counted under the plan its user had when the
--         play started (point-in-time join), and the naive join on user_id for comparison.
--
-- run.sh delivers data/batch1 into incoming/, runs, then delivers data/batch2 and runs again.

------------------------------------------------------------------------------------------ bronze

CREATE OR REFRESH STREAMING TABLE bronze_users
COMMENT 'Account change records, one per line, as exported by the account system'
AS SELECT * FROM STREAM read_files('incoming/users', format => 'json',
  schema => 'user_id INT, name STRING, country STRING, plan STRING, op STRING, updated_at TIMESTAMP');

CREATE OR REFRESH STREAMING TABLE bronze_artists
COMMENT 'Artist records from the catalogue'
AS SELECT * FROM STREAM read_files('incoming/artists', format => 'csv', header => true,
  schema => 'artist_id INT, name STRING, country STRING, updated_at TIMESTAMP');

CREATE OR REFRESH STREAMING TABLE bronze_tracks
COMMENT 'Track records from the catalogue: new tracks, genre reclassifications, re-releases'
AS SELECT * FROM STREAM read_files('incoming/tracks', format => 'csv', header => true,
  schema => 'track_id INT, artist_id INT, title STRING, genre STRING, duration_ms INT, updated_at TIMESTAMP');

CREATE OR REFRESH STREAMING TABLE bronze_streams
COMMENT 'Play reports from the clients; a correction repeats stream_id with a later updated_at'
AS SELECT * FROM STREAM read_files('incoming/streams', format => 'csv', header => true,
  schema => 'stream_id BIGINT, user_id INT, track_id INT, started_at TIMESTAMP, ms_played BIGINT, updated_at TIMESTAMP');

------------------------------------------------------------------------------------------ silver

CREATE OR REFRESH STREAMING TABLE silver_users (
  CONSTRAINT valid_user_id EXPECT (user_id IS NOT NULL) ON VIOLATION DROP ROW,
  CONSTRAINT known_plan EXPECT (op = 'DELETE' OR plan IN ('free', 'premium', 'family')),
  CONSTRAINT known_op EXPECT (op IN ('UPSERT', 'DELETE')) ON VIOLATION FAIL UPDATE,
  CONSTRAINT valid_updated_at EXPECT (updated_at > TIMESTAMP '2000-01-01 00:00:00') ON VIOLATION FAIL UPDATE
)
COMMENT 'Account changes with a user_id, plan names normalised (an unknown plan is kept and counted)'
AS SELECT user_id, trim(name) AS name, upper(trim(country)) AS country, lower(trim(plan)) AS plan,
          op, updated_at
FROM STREAM(bronze_users);

CREATE OR REFRESH STREAMING TABLE silver_tracks (
  CONSTRAINT valid_track_id EXPECT (track_id IS NOT NULL AND updated_at IS NOT NULL) ON VIOLATION FAIL UPDATE,
  CONSTRAINT positive_duration EXPECT (duration_ms > 0) ON VIOLATION DROP ROW
)
COMMENT 'Track records that can be played'
AS SELECT track_id, artist_id, trim(title) AS title, lower(trim(genre)) AS genre, duration_ms, updated_at
FROM STREAM(bronze_tracks);

CREATE OR REFRESH STREAMING TABLE silver_streams (
  CONSTRAINT valid_stream EXPECT (stream_id IS NOT NULL AND started_at IS NOT NULL AND updated_at IS NOT NULL) ON VIOLATION FAIL UPDATE,
  CONSTRAINT valid_user_id EXPECT (user_id IS NOT NULL) ON VIOLATION DROP ROW,
  CONSTRAINT valid_ms_played EXPECT (ms_played >= 0) ON VIOLATION DROP ROW,
  CONSTRAINT in_service_period EXPECT (started_at >= TIMESTAMP '2025-01-01 00:00:00')
)
COMMENT 'Play reports with a user and a non-negative duration'
AS SELECT stream_id, user_id, track_id, started_at, ms_played, updated_at
FROM STREAM(bronze_streams);

-------------------------------------------------------------------------------------------- gold

CREATE OR REFRESH STREAMING TABLE dim_user
COMMENT 'Every version of every account (SCD type 2): valid from __START_AT to __END_AT';

CREATE FLOW dim_user_flow AS AUTO CDC INTO dim_user
FROM STREAM(silver_users)
KEYS (user_id)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY updated_at
COLUMNS * EXCEPT (op, updated_at)
STORED AS SCD TYPE 2;

CREATE OR REFRESH STREAMING TABLE dim_track
COMMENT 'Every version of every track (SCD type 2): genre and title as they were at each time';

CREATE FLOW dim_track_flow AS AUTO CDC INTO dim_track
FROM STREAM(silver_tracks)
KEYS (track_id)
SEQUENCE BY updated_at
COLUMNS * EXCEPT (updated_at)
STORED AS SCD TYPE 2;

CREATE OR REFRESH STREAMING TABLE dim_artist
COMMENT 'The latest record of each artist (SCD type 1)';

CREATE FLOW dim_artist_flow AS AUTO CDC INTO dim_artist
FROM STREAM(bronze_artists)
KEYS (artist_id)
SEQUENCE BY updated_at
STORED AS SCD TYPE 1;

CREATE OR REFRESH STREAMING TABLE fact_stream
COMMENT 'One row per play, its latest report (SCD type 1): corrections replace, redeliveries collapse';

CREATE FLOW fact_stream_flow AS AUTO CDC INTO fact_stream
FROM STREAM(silver_streams)
KEYS (stream_id)
SEQUENCE BY updated_at
STORED AS SCD TYPE 1;

------------------------------------------------------------------------------------------- views

-- Point-in-time join: a play counts under the version of its user valid when it started.
-- Versions of one user do not overlap, so each play matches at most one version.
CREATE OR REFRESH MATERIALIZED VIEW plan_hours_by_month
COMMENT 'Hours streamed per month and plan, each play under the plan its user had when it started'
AS SELECT CAST(date_trunc('month', s.started_at) AS DATE) AS month,
          u.plan,
          count(*) AS streams,
          round(sum(s.ms_played) / 3600000.0, 2) AS hours
FROM fact_stream s
JOIN dim_user u
  ON u.user_id = s.user_id
 AND s.started_at >= u.__START_AT
 AND (u.__END_AT IS NULL OR s.started_at < u.__END_AT)
GROUP BY CAST(date_trunc('month', s.started_at) AS DATE), u.plan;

-- The naive join, for comparison: on user_id only. Every version of a user matches every play
-- of that user, so a user with two premium versions has each play counted twice, and a play
-- made on the free plan counts as premium if the user was premium at any other time.
CREATE OR REFRESH MATERIALIZED VIEW plan_hours_by_month_naive
COMMENT 'The same numbers from a join on user_id only (wrong: counts a play once per version of its user)'
AS SELECT CAST(date_trunc('month', s.started_at) AS DATE) AS month,
          u.plan,
          count(*) AS streams,
          round(sum(s.ms_played) / 3600000.0, 2) AS hours
FROM fact_stream s
JOIN dim_user u ON u.user_id = s.user_id
GROUP BY CAST(date_trunc('month', s.started_at) AS DATE), u.plan;

-- Hours per month and genre, with each track's genre as it was when the play started.
CREATE OR REFRESH MATERIALIZED VIEW genre_hours_by_month
COMMENT 'Hours streamed per month and genre (genre valid at the start of each play)'
AS SELECT CAST(date_trunc('month', s.started_at) AS DATE) AS month,
          t.genre,
          count(*) AS streams,
          round(sum(s.ms_played) / 3600000.0, 2) AS hours
FROM fact_stream s
JOIN dim_track t
  ON t.track_id = s.track_id
 AND s.started_at >= t.__START_AT
 AND (t.__END_AT IS NULL OR s.started_at < t.__END_AT)
GROUP BY CAST(date_trunc('month', s.started_at) AS DATE), t.genre;
