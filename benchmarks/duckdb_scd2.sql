-- DuckDB formulation of strata's AUTO CDC ... STORED AS SCD TYPE 2 fold.
--
-- Input: a relation named `events` (id, name, city, amount, op, seq); run.py
-- defines it as a view over the workload's parquet files.  seq is unique per id.
-- Output: one row per version: id, name, city, amount, __START_AT, __END_AT.
--
-- Per key, in seq order, the fold keeps the open version (or none):
--   * an upsert starts a new version iff there is no previous event, or the
--     previous event is a delete, or the previous event is an upsert whose
--     values differ (NULL-safe).  After any upsert the open version carries
--     that upsert's values, so comparing with the previous event is the same
--     as comparing with the open version; an upsert equal to it is a no-op.
--   * a version ends at the seq of the next event that is a delete or starts a
--     version; none such -> __END_AT is NULL (the current version).
--   * a delete writes no row of its own.
WITH ordered AS (
    SELECT id, name, city, amount, op, seq,
           lag(op)     OVER w AS prev_op,
           lag(name)   OVER w AS prev_name,
           lag(city)   OVER w AS prev_city,
           lag(amount) OVER w AS prev_amount
    FROM events
    WINDOW w AS (PARTITION BY id ORDER BY seq)
),
boundaries AS (  -- deletes and version starts; everything else is a no-op
    SELECT id, name, city, amount, op, seq,
           op <> 'D' AND (prev_op IS NULL
                          OR prev_op = 'D'
                          OR name   IS DISTINCT FROM prev_name
                          OR city   IS DISTINCT FROM prev_city
                          OR amount IS DISTINCT FROM prev_amount) AS is_start
    FROM ordered
    WHERE op = 'D' OR prev_op IS NULL OR prev_op = 'D'
       OR name   IS DISTINCT FROM prev_name
       OR city   IS DISTINCT FROM prev_city
       OR amount IS DISTINCT FROM prev_amount
),
versions AS (
    SELECT id, name, city, amount, is_start,
           seq AS __START_AT,
           lead(seq) OVER (PARTITION BY id ORDER BY seq) AS __END_AT
    FROM boundaries
)
SELECT id, name, city, amount, __START_AT, __END_AT
FROM versions
WHERE is_start
