"""The catalog-backed training loader: epoch selection, layout over ranks and workers, reading, decoding."""
