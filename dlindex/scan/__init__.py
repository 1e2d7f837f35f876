"""Scanning an image tree into the catalog: list, walk, diff, probe, write; the scan's workers."""
