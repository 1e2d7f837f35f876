"""Know the data: duplicate groups, near duplicates by hash or embedding, leaks across splits."""
