"""The command line: the only place that maps errors to exit codes (main.py)."""

from loadkit.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
