"""The catalog: connections, schema, transactions, the query log's recording, and paths."""
