"""Scenario: parse the YAML file and validate it into frozen dataclasses.

Validation is strict and exhaustive in the k6 manner: unknown keys are refused with a "did you
mean", and every problem is collected (file:line, key path, what was found, what was expected)
before one ScenarioError is raised. Nothing here talks to a server; `check_against_models` takes
model metadata that the control stage fetched.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadkit.errors import Problem, ScenarioError, suggest
from loadkit.yamlsource import KeyPath, Source, load_yaml

DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
DATA_KINDS = ("random", "zeros", "ones", "constant", "file")
MAX_CONCURRENCY = 10_000
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h))+\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|kib|mb|mib|gb|gib)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1 << 10, "kib": 1 << 10, "mb": 1 << 20, "mib": 1 << 20,
               "gb": 1 << 30, "gib": 1 << 30}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: str = "random"
    value: float | int | bool = 0
    seed: int = 0
    file: Path | None = None


@dataclass(frozen=True)
class RequestTemplate:
    """One kind of request: model, version, batch size and how to fill each input."""

    name: str
    model: str
    batch_size: int
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...] = ()
    version: str = ""
    # False for a model without batching (max_batch_size 0): its tensors carry no batch
    # dimension. Only the server knows; with_model_facts() fills it in after the check.
    batched: bool = True


@dataclass(frozen=True)
class TLSSpec:
    root_certs: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None


TRANSPORTS = ("stream", "unary")


SERVER_LOSS_POLICIES = ("abort", "wait")
SERVER_LOSS_WAIT_S = {"abort": 10.0, "wait": 600.0}


@dataclass(frozen=True)
class TargetSpec:
    """Where load goes. `grpc=None` means the embedded server that loadkit starts itself."""

    grpc: str | None = None
    tls: TLSSpec | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float = 10.0
    secret_values: tuple[str, ...] = field(default=(), repr=False)
    metrics: str | None = None  # Prometheus endpoint; the embedded server supplies its own
    transport: str = "stream"  # "stream": ModelStreamInfer per user; "unary": ModelInfer calls
    # When the server cannot be reached mid-run: wait this long for it, then stop ("abort") or,
    # with "wait", wait longer (server_loss_wait_s) and go on with the next step.
    on_server_loss: str = "abort"
    server_loss_wait_s: float = 10.0
    reload_timeout_s: float = 120.0  # a config swap slower than this fails its phase
    max_message_bytes: int = 4 << 20  # a larger response is RESOURCE_EXHAUSTED, as in grpc
    # Other clients send to the same models: the server's counts include theirs, so client ==
    # server per model cannot be checked (and is reported unchecked, with this reason).
    shared: bool = False


@dataclass(frozen=True)
class ConcurrencyLoad:
    """Closed loop: N users, each sending its next request when the last one answered."""

    levels: tuple[int, ...]
    step_duration_s: float
    warmup_s: float
    spec: str


@dataclass(frozen=True)
class RateLoad:
    """Open loop: requests sent on a schedule fixed in advance, whatever the responses do.

    Latency counts from each request's scheduled send time (no coordinated omission);
    `max_concurrency` caps requests in flight (a send that finds the cap full is dropped and
    counted); a send later than `late_tolerance_s` is sent and counted late.
    """

    levels: tuple[float, ...]  # requests per second, whole run (split between processes)
    step_duration_s: float
    warmup_s: float
    spec: str
    arrival: str = "constant"  # or "poisson"
    seed: int = 0
    max_concurrency: int = 0  # 0: no cap beyond MAX_CONCURRENCY
    late_tolerance_s: float = 0.005


ARRIVALS = ("constant", "poisson")
MAX_RATE = 1_000_000.0


@dataclass(frozen=True)
class Requirements:
    """What a phase needs from the host; unmet, the phase is skipped with a reason, not failed."""

    gpu: bool = False
    files: tuple[Path, ...] = ()


LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p999")
THRESHOLD_METRICS = (*LATENCY_METRICS, "error_rate", "min_throughput", "max_dropped")


@dataclass(frozen=True)
class Threshold:
    """One SLO: a latency max (µs), error_rate / max_dropped max (fraction) or min_throughput
    (infer/s); for every request or one template; `where` is the file:line it came from."""

    metric: str
    limit: float
    template: str | None = None
    where: str = ""

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.metric, self.template)

    @property
    def name(self) -> str:
        return f"{self.metric}[{self.template}]" if self.template else self.metric


@dataclass(frozen=True)
class Thresholds:
    items: tuple[Threshold, ...] = ()
    abort_on_fail: bool = False

    def extended(self, other: Thresholds) -> Thresholds:
        """`other` (a phase's) overrides the same metric for the same template."""
        keys = {t.key for t in other.items}
        items = tuple(t for t in self.items if t.key not in keys) + other.items
        return Thresholds(items, self.abort_on_fail or other.abort_on_fail)


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    load: ConcurrencyLoad | RateLoad
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    requires: Requirements = Requirements()
    thresholds: Thresholds = Thresholds()


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    target: TargetSpec
    requests: dict[str, RequestTemplate]
    mix: dict[str, float]
    think_time_s: float
    phases: tuple[PhaseSpec, ...]
    source: Source = field(repr=False, compare=False)

    @property
    def models(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.requests.values():
            seen.setdefault(t.model, None)
        for phase in self.phases:
            for model in phase.config:
                seen.setdefault(model, None)
        return tuple(seen)

    def redacted(self) -> dict[str, Any]:
        """The scenario as written, with secrets (resolved ${VAR} values) masked."""
        return _redact(self.source.data, self.target.secret_values)


def _redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    if isinstance(value, str) and _ENV_REF.search(value):
        return value  # the reference itself is not the secret
    if isinstance(value, str) and any(s and s in value for s in secrets):
        return "***"
    return value


def _type_name(value: Any) -> str:
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


def _found(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return (
        f"{_type_name(value)} {text}" if not isinstance(value, (dict, list)) else _type_name(value)
    )


class _Checker:
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
                path, f"expected a mapping with keys {', '.join(allowed)}; found {_found(value)}"
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
        self.add((*path, key), f"expected one of {', '.join(options)}; found {_found(m[key])}")
        return default

    def string(self, value: Any, path: KeyPath, what: str = "a string") -> str | None:
        if not isinstance(value, str) or not value.strip():
            self.add(path, f"expected {what}; found {_found(value)}")
            return None
        return value

    def integer(
        self, value: Any, path: KeyPath, minimum: int, maximum: int | None = None
    ) -> int | None:
        if not isinstance(value, int) or isinstance(value, bool):
            self.add(path, f"expected an integer >= {minimum}; found {_found(value)}")
            return None
        if value < minimum or (maximum is not None and value > maximum):
            limit = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            self.add(path, f"expected an integer {limit}; found {value}")
            return None
        return value

    def number(self, value: Any, path: KeyPath, minimum: float, exclusive: bool) -> float | None:
        op = ">" if exclusive else ">="
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.add(path, f"expected a number {op} {minimum:g}; found {_found(value)}")
            return None
        if value < minimum or (exclusive and value == minimum):
            self.add(path, f"expected a number {op} {minimum:g}; found {value}")
            return None
        return float(value)

    def duration(self, value: Any, path: KeyPath, allow_zero: bool) -> float | None:
        """Seconds as a number, or a string such as '500ms', '10s', '2m', '1m30s'."""
        expected = "a duration such as 10, '10s', '500ms' or '1m30s'"
        if isinstance(value, bool):
            self.add(path, f"expected {expected}; found {_found(value)}")
            return None
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str) and _DURATION.match(value):
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(value))
        else:
            self.add(path, f"expected {expected}; found {_found(value)}")
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
            self.add((*path, key), f"expected true or false; found {_found(value)}")
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
                       f"{_found(value)}")
        return None

    def env(self, value: str, path: KeyPath) -> str:
        def sub(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in os.environ:
                self.add(path, f"environment variable {var} is not set (referenced as ${{{var}}})")
                return ""
            self.secrets.append(os.environ[var])
            return os.environ[var]

        return _ENV_REF.sub(sub, value)

    def file(self, value: Any, path: KeyPath) -> Path | None:
        name = self.string(value, path, "a file path")
        if name is None:
            return None
        resolved = (self.base_dir / name).resolve()
        if not resolved.is_file():
            self.add(path, f"file not found: {name} (resolved to {resolved})")
            return None
        return resolved


def parse_ramp(spec: Any) -> tuple[tuple[int, ...] | None, str | None]:
    """'2:16:2' -> (2, 4, ..., 16); 8 -> (8,); [1, 4, 8] -> (1, 4, 8). Returns (levels, error)."""
    expected = "an integer, a list of integers, or a ramp 'start:stop:step' such as '2:16:2'"
    if isinstance(spec, bool):
        return None, f"expected {expected}; found {_found(spec)}"
    if isinstance(spec, int):
        if not 1 <= spec <= MAX_CONCURRENCY:
            return None, f"expected a concurrency between 1 and {MAX_CONCURRENCY}; found {spec}"
        return (spec,), None
    if isinstance(spec, list):
        if not spec or not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
            return None, f"expected {expected}; found {spec!r}"
        if not all(1 <= v <= MAX_CONCURRENCY for v in spec):
            return None, f"expected concurrencies between 1 and {MAX_CONCURRENCY}; found {spec!r}"
        return tuple(spec), None
    if isinstance(spec, str):
        parts = spec.split(":")
        if len(parts) in (2, 3) and all(p.strip().isdigit() for p in parts):
            start, stop = int(parts[0]), int(parts[1])
            step = int(parts[2]) if len(parts) == 3 else 1
            if start < 1 or step < 1:
                return (
                    None,
                    f"expected start >= 1 and step >= 1 in 'start:stop:step'; found '{spec}'",
                )
            if stop < start:
                return None, f"expected stop >= start in 'start:stop:step'; found '{spec}'"
            if stop > MAX_CONCURRENCY:
                return None, f"expected stop <= {MAX_CONCURRENCY}; found '{spec}'"
            return tuple(range(start, stop + 1, step)), None
    return None, f"expected {expected}; found {_found(spec)}"


def _inputs(ck: _Checker, raw: Any, path: KeyPath) -> tuple[InputSpec, ...]:
    if not isinstance(raw, dict) or not raw:
        ck.add(
            path, f"expected a mapping of input name -> {{dtype, shape, data}}; found {_found(raw)}"
        )
        return ()
    out = []
    for name, spec in raw.items():
        p = (*path, name)
        m = ck.mapping(
            spec, p, ("dtype", "shape", "data", "value", "seed", "file"), ("dtype", "shape")
        )
        if m is None:
            continue
        dtype = m.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            extra = " (BYTES inputs are not supported yet)" if dtype == "BYTES" else ""
            ck.add((*p, "dtype"), f"expected one of {', '.join(DTYPES)}; found {dtype!r}{extra}")
            dtype = None
        shape = m.get("shape")
        if "shape" in m and (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)
        ):
            ck.add(
                (*p, "shape"),
                f"expected a list of positive integers such as [3, 224, 224]; found {shape!r}",
            )
            shape = None
        data = m.get("data", "random")
        if data not in DATA_KINDS:
            ck.add((*p, "data"), f"expected one of {', '.join(DATA_KINDS)}; found {data!r}")
            continue
        value: Any = 0
        if data == "constant":
            if "value" not in m:
                ck.add(p, "data: constant needs a 'value'")
            elif not isinstance(m["value"], (int, float)):
                ck.add((*p, "value"), f"expected a number; found {_found(m['value'])}")
            else:
                value = m["value"]
        elif "value" in m:
            ck.add((*p, "value"), f"'value' only goes with data: constant (data is {data})")
        seed = 0
        if "seed" in m:
            if data != "random":
                ck.add((*p, "seed"), f"'seed' only goes with data: random (data is {data})")
            else:
                seed = ck.integer(m["seed"], (*p, "seed"), 0) or 0
        file = None
        if data == "file":
            if "file" not in m:
                ck.add(p, "data: file needs a 'file' (a .npy path relative to the scenario)")
            else:
                file = ck.file(m["file"], (*p, "file"))
        elif "file" in m:
            ck.add((*p, "file"), f"'file' only goes with data: file (data is {data})")
        if dtype is None or shape is None:
            continue
        spec_out = InputSpec(str(name), dtype, tuple(shape), data, value, seed, file)
        if file is not None:
            _check_npy(ck, spec_out, (*p, "file"))
        out.append(spec_out)
    return tuple(out)


def _check_npy(ck: _Checker, spec: InputSpec, path: KeyPath) -> None:
    assert spec.file is not None
    try:
        arr = np.load(spec.file, allow_pickle=False)
    except (OSError, ValueError) as exc:
        ck.add(path, f"cannot read {spec.file.name} as a .npy array: {exc}")
        return
    if tuple(arr.shape) != spec.shape and tuple(arr.shape[1:]) != spec.shape:
        ck.add(
            path,
            f"{spec.file.name} has shape {list(arr.shape)}; expected {list(spec.shape)} "
            f"or [batch, {', '.join(map(str, spec.shape))}]",
        )


def _template(ck: _Checker, name: str, raw: Any, path: KeyPath) -> RequestTemplate | None:
    m = ck.mapping(
        raw, path, ("model", "version", "batch_size", "inputs", "outputs"), ("model", "inputs")
    )
    if m is None:
        return None
    model = ck.string(m.get("model"), (*path, "model"), "a model name") if "model" in m else None
    version = m.get("version", "")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str):
        ck.add((*path, "version"), f"expected a version number or string; found {_found(version)}")
        version = ""
    batch = ck.integer(m.get("batch_size", 1), (*path, "batch_size"), 1)
    inputs = _inputs(ck, m["inputs"], (*path, "inputs")) if "inputs" in m else ()
    outputs = m.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        ck.add((*path, "outputs"), f"expected a list of output names; found {_found(outputs)}")
        outputs = []
    if model is None or batch is None or not inputs:
        return None
    return RequestTemplate(name, model, batch, inputs, tuple(outputs), version)


def _target(ck: _Checker, raw: Any) -> TargetSpec:
    path: KeyPath = ("target",)
    m = ck.mapping(
        raw, path, ("grpc", "tls", "headers", "timeout", "metrics", "transport",
                    "on_server_loss", "server_loss_wait", "reload_timeout", "max_message_size",
                    "shared"),
    )
    if m is None:
        return TargetSpec()
    grpc_addr = None
    if "grpc" in m:
        grpc_addr = ck.string(m["grpc"], (*path, "grpc"), "a host:port such as 127.0.0.1:8001")
        if grpc_addr and not re.match(r"^[\w.\-\[\]:]+:\d+$", grpc_addr):
            ck.add(
                (*path, "grpc"), f"expected host:port such as 127.0.0.1:8001; found {grpc_addr!r}"
            )
    tls = None
    if "tls" in m:
        t = ck.mapping(m["tls"], (*path, "tls"), ("root_certs", "client_cert", "client_key"))
        if t is not None:
            files = {
                k: ck.file(v, (*path, "tls", k))
                for k, v in t.items()
                if k in TLSSpec.__annotations__
            }
            if ("client_cert" in t) != ("client_key" in t):
                ck.add((*path, "tls"), "client_cert and client_key go together")
            tls = TLSSpec(**files)
    headers: list[tuple[str, str]] = []
    if "headers" in m:
        h = m["headers"]
        if not isinstance(h, dict):
            ck.add((*path, "headers"), f"expected a mapping of header -> value; found {_found(h)}")
        else:
            for k, v in h.items():
                if not isinstance(v, str):
                    ck.add((*path, "headers", k), f"expected a string; found {_found(v)}")
                    continue
                headers.append((k.lower(), ck.env(v, (*path, "headers", k))))
    timeout = ck.duration(m["timeout"], (*path, "timeout"), False) if "timeout" in m else 10.0
    metrics = None
    if "metrics" in m:
        metrics = ck.string(m["metrics"], (*path, "metrics"), "a URL such as http://host:8002/metrics")
        if metrics and not re.match(r"^https?://[^\s/]+(/\S*)?$", metrics):
            ck.add(
                (*path, "metrics"),
                f"expected a URL such as http://127.0.0.1:8002/metrics; found {metrics!r}",
            )
            metrics = None
    transport = ck.choice(m, "transport", path, TRANSPORTS, "stream")
    policy = ck.choice(m, "on_server_loss", path, SERVER_LOSS_POLICIES, "abort")
    wait_s = SERVER_LOSS_WAIT_S[policy]
    if "server_loss_wait" in m:
        wait_s = ck.duration(m["server_loss_wait"], (*path, "server_loss_wait"), False) or wait_s
    reload_s = 120.0
    if "reload_timeout" in m:
        reload_s = ck.duration(m["reload_timeout"], (*path, "reload_timeout"), False) or reload_s
    max_bytes = 4 << 20
    if "max_message_size" in m:
        max_bytes = ck.size(m["max_message_size"], (*path, "max_message_size")) or max_bytes
    return TargetSpec(
        grpc_addr, tls, tuple(headers), timeout or 10.0, tuple(ck.secrets), metrics, transport,
        policy, wait_s, reload_s, max_bytes, ck.boolean(m, "shared", path, False),
    )


def _load(ck: _Checker, raw: Any, path: KeyPath) -> ConcurrencyLoad | RateLoad | None:
    allowed = (
        "concurrency", "rate", "step_duration", "warmup", "arrival", "seed", "max_concurrency",
        "late_tolerance",
    )
    m = ck.mapping(raw, path, allowed, ("step_duration",))
    if m is None:
        return None
    if ("concurrency" in m) == ("rate" in m):
        ck.add(path, "expected exactly one of 'concurrency' (closed loop) or 'rate' (open loop)")
        return None
    step = (
        ck.duration(m["step_duration"], (*path, "step_duration"), False)
        if "step_duration" in m
        else None
    )
    warmup = ck.duration(m.get("warmup", 2.0), (*path, "warmup"), True)
    if "concurrency" in m:
        for key in ("arrival", "seed", "max_concurrency", "late_tolerance"):
            if key in m:
                ck.add((*path, key), f"'{key}' applies to a 'rate' load, not to 'concurrency'")
        levels, err = parse_ramp(m["concurrency"])
        if err:
            ck.add((*path, "concurrency"), err)
        if levels is None or step is None or warmup is None:
            return None
        return ConcurrencyLoad(levels, step, warmup, str(m["concurrency"]))
    rates, err = parse_rate_ramp(m["rate"])
    if err:
        ck.add((*path, "rate"), err)
    arrival = ck.choice(m, "arrival", path, ARRIVALS, "constant")
    seed = m.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        ck.add((*path, "seed"), f"expected a non-negative integer; found {_found(seed)}")
        seed = 0
    cap = m.get("max_concurrency", 0)
    if "max_concurrency" in m and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CONCURRENCY
    ):
        ck.add(
            (*path, "max_concurrency"),
            f"expected an integer between 1 and {MAX_CONCURRENCY}; found {_found(cap)}",
        )
        cap = 0
    late = ck.duration(m.get("late_tolerance", 0.005), (*path, "late_tolerance"), True)
    if rates is None or step is None or warmup is None or late is None:
        return None
    return RateLoad(
        rates, step, warmup, str(m["rate"]), str(arrival), seed, cap, late
    )


def parse_rate_ramp(spec: Any) -> tuple[tuple[float, ...] | None, str | None]:
    """'100:500:100' -> (100, 200, ..., 500) requests/s; 250 -> (250,); [50, 200] -> (50, 200)."""
    expected = (
        "a rate in requests/s, a list of rates, or a ramp 'start:stop:step' such as '100:500:100'"
    )

    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_RATE

    if ok(spec):
        return (float(spec),), None
    if isinstance(spec, list) and spec and all(ok(v) for v in spec):
        return tuple(float(v) for v in spec), None
    if isinstance(spec, str):
        text = spec.strip().removesuffix("/s")
        parts = text.split(":")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) == 1 and 0 < nums[0] <= MAX_RATE:
            return (nums[0],), None
        if len(parts) in (2, 3) and len(nums) == len(parts):
            start, stop = nums[0], nums[1]
            step = nums[2] if len(nums) == 3 else 1.0
            if start <= 0 or step <= 0:
                return None, f"expected start > 0 and step > 0 in 'start:stop:step'; found '{spec}'"
            if stop < start:
                return None, f"expected stop >= start in 'start:stop:step'; found '{spec}'"
            if stop > MAX_RATE:
                return None, f"expected stop <= {MAX_RATE:.0f}; found '{spec}'"
            n = int((stop - start) / step + 1e-9) + 1
            return tuple(round(start + i * step, 6) for i in range(n)), None
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return None, f"expected a rate above 0 and at most {MAX_RATE:.0f} requests/s; found {spec}"
    return None, f"expected {expected}; found {_found(spec)}"


def _phases(ck: _Checker, raw: Any) -> tuple[PhaseSpec, ...]:
    if not isinstance(raw, list) or not raw:
        ck.add(("phases",), f"expected a non-empty list of phases; found {_found(raw)}")
        return ()
    out: list[PhaseSpec] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        p: KeyPath = ("phases", i)
        m = ck.mapping(
            item, p, ("name", "load", "config", "requires", "thresholds"), ("name", "load")
        )
        if m is None:
            continue
        name = ck.string(m.get("name"), (*p, "name"), "a phase name") if "name" in m else None
        if name in names:
            ck.add((*p, "name"), f"duplicate phase name '{name}'")
        if name:
            names.add(name)
        load = _load(ck, m["load"], (*p, "load")) if "load" in m else None
        config: dict[str, dict[str, Any]] = {}
        if "config" in m:
            from loadkit.control.config import check_overlay  # pure: validates field names

            c = m["config"]
            if not isinstance(c, dict):
                ck.add(
                    (*p, "config"),
                    f"expected a mapping of model -> config overlay; found {_found(c)}",
                )
            else:
                for model, overlay in c.items():
                    for sub, msg in check_overlay(overlay):
                        ck.add((*p, "config", model, *sub), msg)
                    if isinstance(overlay, dict):
                        config[model] = overlay
        requires = _requires(ck, m.get("requires"), (*p, "requires"), config)
        own = _thresholds(ck, m["thresholds"], (*p, "thresholds")) if "thresholds" in m else None
        if name and load:
            out.append(PhaseSpec(name, load, config, requires, own or Thresholds()))
    return tuple(out)


def _fraction(ck: _Checker, value: Any, path: KeyPath) -> float | None:
    """'1%' or 0.01 -> 0.01."""
    expected = "a fraction such as 0.01 or a percentage such as '1%'"
    if isinstance(value, str) and re.match(r"^\s*\d+(\.\d+)?\s*%\s*$", value):
        f = float(value.strip().rstrip("%")) / 100
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
    else:
        ck.add(path, f"expected {expected}; found {_found(value)}")
        return None
    if not 0 <= f <= 1:
        ck.add(path, f"expected {expected} between 0 and 100%; found {value!r}")
        return None
    return f


def _threshold_items(
    ck: _Checker, m: dict[str, Any], path: KeyPath, template: str | None
) -> list[Threshold]:
    out = []
    for metric, value in m.items():
        p = (*path, metric)
        where = ck.where(p)
        if metric in LATENCY_METRICS:
            seconds = ck.duration(value, p, False)
            if seconds is not None:
                out.append(Threshold(metric, seconds * 1e6, template, where))
        elif metric in ("error_rate", "max_dropped"):
            f = _fraction(ck, value, p)
            if f is not None:
                out.append(Threshold(metric, f, template, where))
        elif metric == "min_throughput":
            n = ck.number(value, p, 0, exclusive=True)
            if n is not None:
                out.append(Threshold(metric, n, template, where))
    return out


def _thresholds(ck: _Checker, raw: Any, path: KeyPath) -> Thresholds | None:
    """`thresholds: {p99: 50ms, error_rate: 1%, min_throughput: 500, templates: {...}}`."""
    m = ck.mapping(raw, path, (*THRESHOLD_METRICS, "abort_on_fail", "templates"))
    if m is None:
        return None
    abort = ck.boolean(m, "abort_on_fail", path, False)
    items = _threshold_items(
        ck, {k: v for k, v in m.items() if k in THRESHOLD_METRICS}, path, None
    )
    if "templates" in m:
        t = m["templates"]
        if not isinstance(t, dict):
            ck.add(
                (*path, "templates"),
                f"expected a mapping of request name -> thresholds; found {_found(t)}",
            )
        else:
            for tname, traw in t.items():
                tp = (*path, "templates", tname)
                if tname not in ck.request_names:
                    ck.add(tp, f"no request template named '{tname}'{ck.suggest(tname)}")
                    continue
                tm = ck.mapping(traw, tp, LATENCY_METRICS + ("error_rate",))
                if tm is not None:
                    items += _threshold_items(ck, tm, tp, str(tname))
    return Thresholds(tuple(items), abort)


def _requires(
    ck: _Checker, raw: Any, path: KeyPath, config: dict[str, dict[str, Any]]
) -> Requirements:
    """`requires: {gpu: true, files: [...]}`; a KIND_GPU overlay implies gpu: true."""
    from loadkit.control.config import needs_gpu  # pure

    gpu = any(needs_gpu(overlay) for overlay in config.values())
    files: list[Path] = []
    if raw is None:
        return Requirements(gpu)
    m = ck.mapping(raw, path, ("gpu", "files"))
    if m is None:
        return Requirements(gpu)
    gpu = ck.boolean(m, "gpu", path, False) or gpu
    if "files" in m:
        names = m["files"]
        if not isinstance(names, list):
            ck.add((*path, "files"), f"expected a list of file paths; found {_found(names)}")
        else:
            for i, name in enumerate(names):
                text = ck.string(name, (*path, "files", i), "a file path")
                if text:  # relative to the scenario file; absence skips the phase at run time
                    files.append((ck.base_dir / text).resolve())
    return Requirements(gpu, tuple(files))


def _mix(ck: _Checker, raw: Any, names: list[str]) -> dict[str, float]:
    if raw is None:
        return {n: 1.0 for n in names}
    if not isinstance(raw, dict) or not raw:
        ck.add(("mix",), f"expected a mapping of request name -> weight; found {_found(raw)}")
        return {}
    out: dict[str, float] = {}
    for name, weight in raw.items():
        if name not in names:
            hint = suggest(name, names)
            ck.add(
                ("mix", name),
                f"no request named '{name}' in requests{hint} (have: {', '.join(names)})",
            )
            continue
        w = ck.number(weight, ("mix", name), 0, exclusive=False)
        if w is not None:
            out[name] = w
    if out and sum(out.values()) <= 0:
        ck.add(("mix",), "the mix weights sum to 0; expected at least one weight > 0")
    return {k: v for k, v in out.items() if v > 0}


TOP_KEYS = (
    "name", "description", "target", "requests", "mix", "think_time", "thresholds", "phases"
)


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate a scenario file offline; raises ScenarioError listing every problem."""
    path = Path(path)
    src = load_yaml(path)
    ck = _Checker(src, path.resolve().parent)
    top = ck.mapping(src.data, (), TOP_KEYS, ("requests", "phases"))
    if top is None:
        raise ScenarioError(ck.problems or [src.problem((), "not a scenario")])
    name = top.get("name", path.stem)
    if not isinstance(name, str) or not re.match(r"^[\w.\-]+$", name):
        ck.add(
            ("name",), f"expected a name of letters, digits, '.', '_' or '-'; found {_found(name)}"
        )
        name = path.stem
    target = _target(ck, top.get("target", {}))
    requests: dict[str, RequestTemplate] = {}
    raw_requests = top.get("requests")
    if "requests" in top:
        if not isinstance(raw_requests, dict) or not raw_requests:
            ck.add(
                ("requests",),
                f"expected a mapping of request name -> template; found {_found(raw_requests)}",
            )
        else:
            for rname, rraw in raw_requests.items():
                t = _template(ck, rname, rraw, ("requests", rname))
                if t is not None:
                    requests[rname] = t
    names = list(raw_requests) if isinstance(raw_requests, dict) else []
    mix = _mix(ck, top.get("mix"), names)
    think = ck.duration(top.get("think_time", 0), ("think_time",), True)
    ck.request_names = tuple(names)
    thresholds = None
    if "thresholds" in top:
        thresholds = _thresholds(ck, top["thresholds"], ("thresholds",))
    phases = _phases(ck, top["phases"]) if "phases" in top else ()
    if thresholds is not None:
        phases = tuple(
            dataclasses.replace(ph, thresholds=thresholds.extended(ph.thresholds))
            for ph in phases
        )
    if ck.problems:
        raise ScenarioError(ck.problems)
    return Scenario(name, path, target, requests, mix, think or 0.0, phases, src)


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about one model: enough to check a template against it."""

    name: str
    max_batch_size: int
    inputs: dict[str, tuple[str, tuple[int, ...]]]
    outputs: dict[str, tuple[str, tuple[int, ...]]]
    decoupled: bool = False  # model_transaction_policy.decoupled: several responses a request
    sequence: bool = False  # sequence_batching: requests need correlation ids


def unbatched_models(models: dict[str, ModelInfo | str]) -> list[str]:
    return sorted(m for m, i in models.items() if isinstance(i, ModelInfo) and
                  i.max_batch_size == 0)


def with_model_facts(scenario: Scenario, unbatched: list[str]) -> Scenario:
    """The scenario with what only the server knows: which templates' models do not batch."""
    requests = {
        n: dataclasses.replace(t, batched=t.model not in unbatched)
        for n, t in scenario.requests.items()
    }
    return dataclasses.replace(scenario, requests=requests)


def check_against_models(scenario: Scenario, models: dict[str, ModelInfo | str]) -> list[Problem]:
    """Compare templates with server metadata; a str value is the server's reason it has none."""
    src = scenario.source
    problems: list[Problem] = []
    for t in scenario.requests.values():
        base: KeyPath = ("requests", t.name)
        info = models.get(t.model)
        if info is None or isinstance(info, str):
            reason = f": {info}" if isinstance(info, str) else ""
            problems.append(
                src.problem((*base, "model"), f"the server has no ready model '{t.model}'{reason}")
            )
            continue
        if info.sequence or info.decoupled:
            kind = (
                "uses sequence batching (every request needs a correlation id and START/END "
                "flags)" if info.sequence else
                "is decoupled (a request gets several responses; loadkit would count each as a "
                "request)"
            )
            problems.append(
                src.problem((*base, "model"), f"model '{t.model}' {kind}: loadkit cannot "
                            "measure such a model yet; expected a model without "
                            f"{'sequence_batching' if info.sequence else 'decoupled transactions'}")
            )
            continue
        if info.max_batch_size == 0 and t.batch_size != 1:
            problems.append(
                src.problem(
                    (*base, "batch_size"),
                    f"model '{t.model}' does not batch (max_batch_size 0); "
                    f"expected 1, found {t.batch_size}",
                )
            )
        elif info.max_batch_size and t.batch_size > info.max_batch_size:
            problems.append(
                src.problem(
                    (*base, "batch_size"),
                    f"expected at most model '{t.model}''s max_batch_size {info.max_batch_size}; "
                    f"found {t.batch_size}",
                )
            )
        given = {i.name: i for i in t.inputs}
        for name in given:
            if name not in info.inputs:
                hint = suggest(name, info.inputs)
                problems.append(
                    src.problem(
                        (*base, "inputs", name),
                        f"model '{t.model}' has no input '{name}'{hint} "
                        f"(has: {', '.join(info.inputs)})",
                    )
                )
        for name, (dtype, dims) in info.inputs.items():
            p: KeyPath = (*base, "inputs", name)
            if name not in given:
                problems.append(
                    src.problem(
                        (*base, "inputs"), f"input '{name}' of model '{t.model}' is missing"
                    )
                )
                continue
            spec = given[name]
            if spec.dtype != dtype:
                problems.append(
                    src.problem(
                        (*p, "dtype"), f"model '{t.model}' expects {dtype}; found {spec.dtype}"
                    )
                )
            want = dims[1:] if info.max_batch_size else dims
            if len(want) != len(spec.shape) or any(
                w not in (-1, s) for w, s in zip(want, spec.shape, strict=True)
            ):
                problems.append(
                    src.problem(
                        (*p, "shape"),
                        f"model '{t.model}' expects shape {list(want)} (without the batch "
                        f"dimension); found {list(spec.shape)}",
                    )
                )
        for out in t.outputs:
            if out not in info.outputs:
                problems.append(
                    src.problem(
                        (*base, "outputs"),
                        f"model '{t.model}' has no output '{out}' (has: {', '.join(info.outputs)})",
                    )
                )
    return problems
