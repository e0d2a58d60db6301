"""Triton's trace extension (the TraceSetting RPC): read a model's (or the server's) trace
settings, set them for a capture, and put back what was there. The trace file is the server's
own (`--trace-config triton,file=...` at its start; the API refuses to move it) and is
written on the server's disk: `loadkit trace` says where, and docs/replay.md how to reach it
(a shared volume in compose or Kubernetes)."""

from __future__ import annotations

from typing import Any

Settings = dict[str, list[str]]


def read_settings(control: Any, model: str = "") -> Settings:
    """The trace settings that apply to `model` ('' for the server's own)."""
    return dict(control.trace_settings(model))


def write_settings(control: Any, settings: Settings, model: str = "") -> Settings:
    """Set (only) the given settings; an empty list clears one back to the server's."""
    return dict(control.trace_settings(model, settings))


CHANGED = ("trace_level", "trace_rate", "trace_count", "log_frequency")


def capture_settings(rate: int, log_frequency: int) -> Settings:
    """What a capture sets: every `rate`-th request traced with its timestamps into the
    server's trace file (set when it started: Triton's API cannot move it), written as
    file.0, file.1, ... of `log_frequency` traces each, the rest when the setting changes
    again."""
    return {"trace_level": ["TIMESTAMPS"], "trace_rate": [str(rate)], "trace_count": ["-1"],
            "log_frequency": [str(log_frequency)]}


def restore(control: Any, before: Settings, model: str = "") -> None:
    """Put back the settings a capture changed (as they were read before it)."""
    write_settings(control, {k: before[k] for k in CHANGED if k in before}, model)
