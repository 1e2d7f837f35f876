"""Texts that come with images: sidecars read by scan, files attached by `text import` (docs/text.md)."""
