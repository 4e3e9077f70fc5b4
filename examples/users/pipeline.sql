-- The example of the Databricks AUTO CDC documentation, run by strata.
-- Bronze: every change event, as delivered. Silver: the full history of each user (SCD type 2).

CREATE OR REFRESH STREAMING TABLE users_cdc
COMMENT 'Raw change events, one row per event'
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
                                   schema => 'userId INT, name STRING, city STRING, operation STRING, sequenceNum INT');

CREATE OR REFRESH STREAMING TABLE users;

CREATE FLOW users_flow AS AUTO CDC INTO users
FROM STREAM(users_cdc)
KEYS (userId)
APPLY AS DELETE WHEN operation = "DELETE"
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 2;
