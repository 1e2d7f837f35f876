"""The SQLite backend: catalog files."""
