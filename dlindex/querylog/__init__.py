"""Reading the query log: summaries by fingerprint, importing SQL logs, clearing."""
