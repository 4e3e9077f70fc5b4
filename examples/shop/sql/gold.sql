-- The current price list, in ${currency}: reads the generated SCD type 1 table `products`.
CREATE OR REFRESH STREAMING TABLE price_list
AS SELECT sku, price, '${currency}' AS currency FROM STREAM(products);
