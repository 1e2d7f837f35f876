"""The PostgreSQL backend: server catalogs (docs/postgres.md)."""
