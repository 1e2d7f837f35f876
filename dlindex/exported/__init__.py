"""An export on disk, read back: its index, its files, its formats; nothing of the catalog or the planner."""
