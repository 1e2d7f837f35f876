"""dlindex's version: a leaf, so any layer can say which dlindex wrote a file without
importing the package root (which sits above every layer)."""

__version__ = "0.1.0"
