"""Scanning an image tree into the catalog: walk, diff, probe, and the scan's worker tasks."""
