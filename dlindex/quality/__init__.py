"""Duplicate groups, near duplicates and leaks across splits."""
