-- A day later: a customer moves and upgrades, a price changes, a customer is deleted,
-- orders are paid and placed.
UPDATE customers SET city = 'Bergen', tier = 'premium' WHERE id = 1;
UPDATE products SET price = 34.90 WHERE sku = 'A-1';
INSERT INTO customers VALUES (4, 'Dee', 'Lyon', 'basic');
DELETE FROM customers WHERE id = 3;
UPDATE orders SET status = 'paid', updated_at = '2024-03-02 08:00:00+00' WHERE id = 100;
INSERT INTO orders VALUES (102, 4, 'A-1', 3, 'placed', '2024-03-02 11:00:00+00');
