-- Bronze, silver and gold from an operational PostgreSQL database.
-- The password is read from the environment variable SHOP_PW (run.sh sets it).
CREATE CONNECTION shop TYPE postgresql
OPTIONS (host '${pg_host}', port '${pg_port}', database '${pg_database}', user '${pg_user}',
         password_env 'SHOP_PW');

-- Bronze: customers and products through the change log (every change, deletes included),
-- orders by their updated_at watermark.
CREATE OR REFRESH STREAMING TABLE customers_changes
AS SELECT * FROM STREAM read_database('shop', table => 'public.customers', mode => 'cdc',
                                      slot => 'strata_example_customers');
CREATE OR REFRESH STREAMING TABLE products_changes
AS SELECT * FROM STREAM read_database('shop', table => 'public.products', mode => 'cdc',
                                      slot => 'strata_example_products');
CREATE OR REFRESH STREAMING TABLE orders_raw
AS SELECT * FROM STREAM read_database('shop', table => 'public.orders',
                                      watermark => 'updated_at, id');

-- Silver: SCD2 dimensions with their full history, the current state of orders.
CREATE OR REFRESH STREAMING TABLE dim_customers;
CREATE FLOW dim_customers_flow AS AUTO CDC INTO dim_customers
FROM STREAM(customers_changes)
KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols)
STORED AS SCD TYPE 2;

CREATE OR REFRESH STREAMING TABLE dim_products;
CREATE FLOW dim_products_flow AS AUTO CDC INTO dim_products
FROM STREAM(products_changes)
KEYS (sku)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols)
STORED AS SCD TYPE 2;

CREATE OR REFRESH STREAMING TABLE orders;
CREATE FLOW orders_flow AS AUTO CDC INTO orders
FROM STREAM(orders_raw)
KEYS (id)
SEQUENCE BY updated_at
STORED AS SCD TYPE 1;

-- Gold: revenue per customer tier, with the tier and price that are current now.
CREATE OR REFRESH MATERIALIZED VIEW revenue_by_tier AS
SELECT c.tier, sum(o.quantity * p.price) AS revenue, count(*) AS orders
FROM orders o
JOIN dim_customers c ON c.id = o.customer_id AND c.__END_AT IS NULL
JOIN dim_products p ON p.sku = o.sku AND p.__END_AT IS NULL
GROUP BY c.tier;
