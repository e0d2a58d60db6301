"""The engine: one native thread per process that sends every inference (core.py)."""
