-- Customer history from monthly full extracts (AUTO CDC FROM SNAPSHOT), plan history from
-- change events (AUTO CDC), both kept as Kimball-style SCD2 dimensions, and a point-in-time
-- table that says which version of each was valid at every month end.

CREATE OR REFRESH STREAMING TABLE customer_deliveries
AS SELECT * FROM STREAM read_files('data/deliveries', format => 'csv', header => true,
  schema => 'customer_id INT, name STRING, city STRING, reporting_date DATE');

CREATE OR REFRESH STREAMING TABLE dim_customer
TBLPROPERTIES ('strata.scd.convention' = 'kimball');

CREATE FLOW customers_hist AS AUTO CDC FROM SNAPSHOT INTO dim_customer
FROM STREAM(customer_deliveries)
KEYS (customer_id)
SNAPSHOT VERSION BY reporting_date
COLUMNS * EXCEPT (reporting_date)
STORED AS SCD TYPE 2;

CREATE OR REFRESH STREAMING TABLE plan_changes
AS SELECT * FROM STREAM read_files('data/plan_changes', format => 'csv', header => true,
  schema => 'customer_id INT, plan STRING, changed_on DATE');

CREATE OR REFRESH STREAMING TABLE dim_plan
TBLPROPERTIES ('strata.scd.convention' = 'kimball');

CREATE FLOW plans_hist AS AUTO CDC INTO dim_plan
FROM STREAM(plan_changes)
KEYS (customer_id)
SEQUENCE BY changed_on
COLUMNS * EXCEPT (changed_on)
STORED AS SCD TYPE 2;

CREATE OR REFRESH POINT IN TIME TABLE customer_month_end
KEYS (customer_id)
AS OF (DATE '2024-01-31', DATE '2024-02-29', DATE '2024-03-31')
FROM dim_customer, dim_plan;
