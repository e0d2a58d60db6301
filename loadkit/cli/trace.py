"""`loadkit trace`: turn on Triton's tracing (timestamps) for a while through its trace API,
then put the settings back, and say where the server wrote the file (a replay reads it)."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

from loadkit.errors import LoadkitError
from loadkit.exits import EXIT_OK, EXIT_SIGINT, err

MAX_CAPTURE_S = 24 * 3600.0


def add_trace_command(sub: Any, command: Any) -> None:
    t = command(sub, "trace", "capture Triton's own trace of live traffic, to replay it",
                "Set Triton's trace settings (level TIMESTAMPS, every N-th request) through "
                "its trace API for the given time, then put back what was there. The server "
                "writes into the trace file it was started with (--trace-config "
                "triton,file=F; `loadkit serve --trace-file F`), on its own disk: F.0, F.1, "
                "... of --log-frequency traces each, the rest when the settings are put back.")
    t.add_argument("--target", "-u", required=True, help="HOST:PORT of Triton's gRPC endpoint, or "
                   "http://HOST:PORT for its HTTP one")
    t.add_argument("--duration", required=True, help="how long to trace, e.g. 60s or 10m")
    t.add_argument("--rate", type=int, default=1, metavar="N",
                   help="trace every N-th request (default 1: all; a replay then says "
                        "sample_rate: N)")
    t.add_argument("--models", help="comma-separated models (default: the server's setting, "
                                    "every model)")
    t.add_argument("--log-frequency", type=int, default=1000, metavar="N",
                   help="traces per file part (default 1000)")
    t.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    from loadkit.control.http_client import connect
    from loadkit.control.trace import capture_settings, read_settings, restore, write_settings
    from loadkit.scenario.tune import parse_budget

    budget = parse_budget(args.duration)
    if isinstance(budget, str) or not budget[0] or budget[0] > MAX_CAPTURE_S:
        raise LoadkitError(f"--duration: expected a time such as 60s or 10m (at most 24h); "
                           f"found {args.duration!r}")
    if args.rate < 1 or args.log_frequency < 1:
        raise LoadkitError("--rate and --log-frequency: expected at least 1")
    seconds = budget[0]
    models = [m for m in (args.models or "").split(",") if m] or [""]
    with connect(args.target) as control:
        control.wait_live(timeout_s=10, say=err)
        for m in models:
            if m and not control.model_ready(m):
                raise LoadkitError(f"model '{m}': {control.model_info(m)}")
        before = {m: read_settings(control, m) for m in models}
        file = (before[models[0]].get("trace_file") or [""])[0]
        if not file:
            raise LoadkitError(
                f"Triton at {args.target} was started without a trace file, and its trace API "
                "cannot set one: start it with --trace-config triton,file=/path/trace.json "
                "(loadkit serve --trace-file PATH), on a volume loadkit can read")
        local = Path(file)
        parts_before = set(trace_parts(local))
        stop = {"signal": 0}
        old = signal.signal(signal.SIGINT, lambda *_: stop.update(signal=signal.SIGINT))
        try:
            for m in models:
                write_settings(control, capture_settings(args.rate, args.log_frequency), m)
            which = ", ".join(models) if models != [""] else "every model"
            err(f"tracing {which} (1 in {args.rate}) into {file} on the server for "
                f"{seconds:g} s; Ctrl-C ends it early")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not stop["signal"]:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        finally:
            for m in models:
                restore(control, before[m], m)
            signal.signal(signal.SIGINT, old)
    sample = f", sample_rate: {args.rate}" if args.rate > 1 else ""
    new = [p for p in _settled(local) if p not in parts_before]
    if new:
        names = ", ".join(p.name for p in new)
        print(f"trace settings put back; this capture is {names} (beside {file}). Replay it "
              f"with load: {{replay: [{names}]{sample}}} (docs/replay.md)")
    else:
        print(f"trace settings put back; the server wrote this capture as new parts of {file} "
              f"(.0, .1, ... on its own disk; earlier captures are earlier parts). Replay them "
              f"with load: {{replay: [the new parts]{sample}}} (docs/replay.md)")
    return EXIT_SIGINT if stop["signal"] else EXIT_OK


def trace_parts(base: Path) -> list[Path]:
    """The numbered parts Triton has written of `base` (where it can be read from here)."""
    try:
        return sorted((p for p in base.parent.glob(base.name + ".*") if p.suffix[1:].isdigit()),
                      key=lambda p: int(p.suffix[1:]))
    except OSError:
        return []


def _settled(base: Path, wait_s: float = 2.0) -> list[Path]:
    """The parts once the server has written the last (it does so as the settings change)."""
    deadline = time.monotonic() + wait_s
    seen = trace_parts(base)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = trace_parts(base)
        if now == seen and all(_complete(p) for p in now):
            return now
        seen = now
    return seen


def _complete(part: Path) -> bool:
    try:
        return part.read_bytes().rstrip().endswith(b"]")
    except OSError:
        return False
