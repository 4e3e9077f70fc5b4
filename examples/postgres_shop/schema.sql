-- The operational database of a small shop: customers change address, products change
-- price, orders are placed and updated. Loaded into strata by examples/postgres_shop/run.sh.
DROP TABLE IF EXISTS orders, products, customers;
CREATE TABLE customers (
  id int PRIMARY KEY,
  name text NOT NULL,
  city text NOT NULL,
  tier text NOT NULL
);
CREATE TABLE products (
  sku text PRIMARY KEY,
  title text NOT NULL,
  price numeric(10,2) NOT NULL
);
CREATE TABLE orders (
  id bigint PRIMARY KEY,
  customer_id int NOT NULL REFERENCES customers(id),
  sku text NOT NULL REFERENCES products(sku),
  quantity int NOT NULL,
  status text NOT NULL,
  updated_at timestamptz NOT NULL
);
INSERT INTO customers VALUES
  (1, 'Ann', 'Oslo', 'basic'), (2, 'Bob', 'Rome', 'premium'), (3, 'Cy', 'Nice', 'basic');
INSERT INTO products VALUES ('A-1', 'Kettle', 39.90), ('B-2', 'Teapot', 24.50);
INSERT INTO orders VALUES
  (100, 1, 'A-1', 1, 'placed', '2024-03-01 09:00:00+00'),
  (101, 2, 'B-2', 2, 'placed', '2024-03-01 10:30:00+00');
