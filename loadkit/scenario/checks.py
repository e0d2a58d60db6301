"""The checker: walks the raw YAML data, collects every problem with file:line and key path;
each helper returns None for a value it refused, so parsing goes on and all problems are told."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from loadkit.errors import Problem, suggest
from loadkit.scenario.model import ENV_REF
from loadkit.scenario.source import KeyPath, Source

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h))+\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|kib|mb|mib|gb|gib)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20,
               "gb": 1 << 30, "gib": 1 << 30}

def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a string such as '500ms', '10s', '2m', '1m30s' (None when it is
    neither): one reading of a duration for scenario keys and command-line flags."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        if _DURATION.match(value):
            return sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(value))
        try:
            return float(value)
        except ValueError:
            return None
    return None


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def found(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return (
        f"{type_name(value)} {text}" if not isinstance(value, (dict, list)) else type_name(value)
    )


class Checker:
    """Collects problems while walking the raw data; each helper returns None when invalid."""

    def __init__(self, source: Source, base_dir: Path):
        self.src = source
        self.base_dir = base_dir
        self.problems: list[Problem] = []
        self.secrets: list[str] = []
        self.request_names: tuple[str, ...] = ()

    def where(self, path: KeyPath) -> str:
        """file:line of a key, for messages that point back at the scenario."""
        return f"{self.src.file}:{self.src.line(path)}"

    def suggest(self, name: str) -> str:
        return suggest(name, self.request_names)

    def add(self, path: KeyPath, message: str) -> None:
        self.problems.append(self.src.problem(path, message))

    def mapping(
        self, value: Any, path: KeyPath, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.add(
                path, f"expected a mapping with keys {', '.join(allowed)}; found {found(value)}"
            )
            return None
        for key in value:
            if key not in allowed:
                hint = suggest(key, allowed)
                self.add((*path, key), f"unknown key '{key}'{hint} (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                self.add(path, f"missing required key '{key}'")
        return value

    def choice(self, m: dict[str, Any], key: str, path: KeyPath, options: tuple[str, ...],
               default: str) -> str:
        """m[key] when it is one of `options` (default when absent); else a problem and the
        default."""
        if key not in m:
            return default
        if m[key] in options:
            return str(m[key])
        self.add((*path, key), f"expected one of {', '.join(options)}; found {found(m[key])}")
        return default

    def string(self, value: Any, path: KeyPath, what: str = "a string") -> str | None:
        if not isinstance(value, str) or not value.strip():
            self.add(path, f"expected {what}; found {found(value)}")
            return None
        return value

    def integer(
        self, value: Any, path: KeyPath, minimum: int, maximum: int | None = None
    ) -> int | None:
        if not isinstance(value, int) or isinstance(value, bool):
            self.add(path, f"expected an integer >= {minimum}; found {found(value)}")
            return None
        if value < minimum or (maximum is not None and value > maximum):
            limit = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            self.add(path, f"expected an integer {limit}; found {value}")
            return None
        return value

    def number(self, value: Any, path: KeyPath, minimum: float, exclusive: bool) -> float | None:
        op = ">" if exclusive else ">="
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.add(path, f"expected a number {op} {minimum:g}; found {found(value)}")
            return None
        if value < minimum or (exclusive and value == minimum):
            self.add(path, f"expected a number {op} {minimum:g}; found {value}")
            return None
        return float(value)

    def duration(self, value: Any, path: KeyPath, allow_zero: bool) -> float | None:
        """Seconds as a number, or a string such as '500ms', '10s', '2m', '1m30s'."""
        expected = "a duration such as 10, '10s', '500ms' or '1m30s'"
        seconds = parse_duration(value) if not isinstance(value, str) or _DURATION.match(
            value) else None
        if seconds is None:
            self.add(path, f"expected {expected}; found {found(value)}")
            return None
        if seconds < 0 or (seconds == 0 and not allow_zero):
            self.add(
                path, f"expected a duration {'>= 0' if allow_zero else '> 0'}; found {value!r}"
            )
            return None
        return seconds

    def boolean(self, m: dict[str, Any], key: str, path: KeyPath, default: bool) -> bool:
        value = m.get(key, default)
        if not isinstance(value, bool):
            self.add((*path, key), f"expected true or false; found {found(value)}")
            return default
        return value

    def size(self, value: Any, path: KeyPath) -> int | None:
        """A byte count: an integer, or a string such as '4MB', '64 KiB' (MB = 2**20 bytes, as
        grpc's limits are written)."""
        m = _SIZE.match(value) if isinstance(value, str) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if m is not None:
            n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
            if n > 0:
                return n
        self.add(path, f"expected a size in bytes such as 4MB, 512KB or 4194304; found "
                       f"{found(value)}")
        return None

    def env(self, value: str, path: KeyPath) -> str:
        def sub(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in os.environ:
                self.add(path, f"environment variable {var} is not set (referenced as ${{{var}}})")
                return ""
            self.secrets.append(os.environ[var])
            return os.environ[var]

        return ENV_REF.sub(sub, value)

    def file(self, value: Any, path: KeyPath) -> Path | None:
        name = self.string(value, path, "a file path")
        if name is None:
            return None
        resolved = (self.base_dir / name).resolve()
        if not resolved.is_file():
            self.add(path, f"file not found: {name} (resolved to {resolved})")
            return None
        return resolved
