-- A backfill of customer change events into an SCD type 2 history. With
-- `strata run --cluster df://HOST:PORT`, the history's first load and later batches (of at
-- least --cluster-min-events events) run on the cluster's executors.
CREATE OR REFRESH STREAMING TABLE customer_events
AS SELECT * FROM STREAM read_files('data/events', format => 'json',
  schema => 'id BIGINT, city STRING, tier STRING, op STRING, seq BIGINT');

CREATE OR REFRESH STREAMING TABLE customers_history;

CREATE FLOW customers_history_flow AS AUTO CDC INTO customers_history
FROM STREAM(customer_events)
KEYS (id)
APPLY AS DELETE WHEN op = 'delete'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;
