"""One exceptions module: library code raises these, only the CLI maps them to exit codes
(loadkit/exits.py). The transport's own InferError and StreamsFull stay in transport/call.py:
they are a request's outcome, counted per status code, never raised to the user."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


def suggest(name: str, options: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest option (difflib), or "" when none is close."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


class LoadkitError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 2


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a scenario, in the user's own terms."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.path}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class ScenarioError(LoadkitError):
    """The scenario is invalid; carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class TargetError(LoadkitError):
    """The target server cannot be used (unreachable, wrong mode, model missing)."""


class ServerStartError(LoadkitError):
    """The embedded Triton did not become ready; the message quotes its log tail."""


class ControlError(LoadkitError):
    """Triton refused a control-plane request (load, unload, config, statistics); `code` is
    the gRPC status name it answered with ("" when the error did not come from a call)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class ReloadTimeout(ControlError):
    """A config load that did not finish within target.reload_timeout."""


class CapacityInputError(LoadkitError):
    """`loadkit capacity`'s options (--slo, --peak, rates) cannot be read."""


class TuneInputError(LoadkitError):
    """`loadkit tune` cannot start: no tune section, a --resume folder that is not a search."""


class ReportError(LoadkitError):
    """A report folder that cannot be read back (missing or foreign results.json)."""


class ExporterError(LoadkitError):
    """--prometheus-port cannot serve (the port is taken)."""


class DatasetError(ValueError):
    """What is wrong with a data set, in the file's own terms (entry, input, line); the
    scenario check turns it into a Problem."""
