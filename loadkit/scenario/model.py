"""The scenario as frozen data: what a run is asked to do, every field validated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadkit.scenario.source import Source

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
    "BYTES": "object",  # strings: each element sent as a 4-byte little-endian length + bytes
}
DTYPE_ALIASES = {"STRING": "BYTES"}  # Triton's config.pbtxt says TYPE_STRING
DATA_KINDS = ("random", "zeros", "ones", "constant", "file", "dataset")
ORDERS = ("sequential", "random")
ENDPOINTS = ("infer", "generate", "generate_stream")
# A template's prepared requests (data set or generated pool) are held in memory by every
# process that sends: above this the scenario is refused (dataset: {max_size: ...} raises it).
DATASET_MAX_BYTES = 512 << 20
MAX_POOL = 1_000_000
MAX_CONCURRENCY = 10_000
MAX_REPEATS = 50
# `repeats: auto` (loadkit/stats/sequential.py): the first look, and the most rounds by default
MIN_AUTO_ROUNDS = 3
DEFAULT_AUTO_ROUNDS = 10
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int, ...] | None  # None: each data set entry brings its own
    data: str = "random"
    value: float | int | bool | str = 0
    seed: int = 0
    file: Path | None = None
    length: tuple[int, int] = (16, 16)  # BYTES with data: random: characters, min and max
    # Several shapes, each with its weight: a template's pool holds them in these proportions
    shapes: tuple[tuple[tuple[int, ...], float], ...] = ()


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Distinct requests from a file: every entry is one batch-1 request's inputs (as in
    perf_analyzer's --input-data), read and checked when the scenario loads."""

    file: Path
    max_bytes: int = DATASET_MAX_BYTES
    # one dict per entry: input name -> array (BYTES: an object array of bytes)
    entries: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)
    # with validate: true, one dict per entry: output name -> the flat values expected
    expected: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)
    # perf_analyzer's sequence form: each sequence's number of entries, in file order (() for
    # a flat data set); a sequence template walks one sequence's entries in order
    sequences: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SequenceSpec:
    """A stateful model's sequences: each runs `length` requests (varied by up to
    `variation` percent), START on the first, END on the last, one in flight at a time, under
    a correlation id drawn from `ids` (never two open sequences with the same id)."""

    length: int
    variation: float = 0.0  # percent
    ids: tuple[int, int] = (1, 2**31 - 1)
    id_type: str = "uint64"  # or "string": the id sent as its decimal text


@dataclass(frozen=True, kw_only=True)
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
    dataset: DatasetSpec | None = None
    pool: int = 1  # distinct generated requests (random inputs seeded per entry, shapes mixed)
    order: str = "sequential"  # how requests are taken from the pool: in turn, or at random
    # KServe request parameters (priority, timeout, custom keys), sent with every request
    parameters: tuple[tuple[str, bool | int | float | str], ...] = ()
    sequence: SequenceSpec | None = None
    # models this one runs on the server (an ensemble's steps, from its config; BLS calls from
    # the template's `composing_models`): their statistics go beside it in the report
    composing: tuple[str, ...] = ()
    # `composing` came from an ensemble's config (its steps: one request each per request);
    # False for a BLS model's `composing_models`, whose calls per request no config states
    composing_known: bool = False
    # the model's code may call other models (python backend: BLS), declared or not
    scripted: bool = False
    validate: bool = False  # compare every response with the data set's validation_data
    # the model streams several responses per request (a server fact, like `batched`): the
    # request is done at its final response (engine/streaming.py)
    decoupled: bool = False
    llm: Any = None  # an `llm:` template's facts (scenario/llm.py LlmSpec): token counts
    # decoupled models: (after N responses, share of requests) cancelled by the client
    cancel: tuple[int, float] | None = None
    endpoint: str = "infer"  # over HTTP: infer, or the generate extension (docs/doors.md)
    # a template that leaves inputs to the model's metadata: its raw mapping, parsed again
    # once the server says what the model takes (scenario/from_model.py); None when complete
    pending: Any = field(default=None, repr=False, compare=False)
    # a completed template's keys as they would be written: {"inputs": ..., and "sequence":
    # ... for a sequence model that named none} (`loadkit init` writes them; a master sends
    # them to its workers)
    filled: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class TLSSpec:
    root_certs: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None


TRANSPORTS = ("stream", "unary")
PROTOCOLS = ("grpc", "http")  # Triton's doors (docs/doors.md)


SERVER_LOSS_POLICIES = ("abort", "wait")
SERVER_LOSS_WAIT_S = {"abort": 10.0, "wait": 600.0}


@dataclass(frozen=True, kw_only=True)
class TargetSpec:
    """Where load goes. No address means the embedded server that loadkit starts itself."""

    grpc: str | None = None  # host:port (gRPC, or HTTP with protocol: http)
    url: str | None = None  # http://host:port, https://host:port or grpc://host:port
    protocol: str = "grpc"  # the door when the address has no scheme
    http_binary: bool = True  # HTTP: the binary tensor extension (false: JSON tensors)
    shared_memory: str = "none"  # none | system | cuda: where tensors go (docs/doors.md)
    output_shm_bytes: int = 0  # each output's region slot when its shape varies (0: 100 KiB)
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

    @property
    def address(self) -> str | None:
        """The address as the engine and control plane take it: host:port for gRPC,
        http(s)://host:port for HTTP (None: the embedded server)."""
        if self.url:
            return self.url.removeprefix("grpc://").rstrip("/")
        if self.grpc and self.protocol == "http":
            return f"http://{self.grpc}"
        return self.grpc


@dataclass(frozen=True, kw_only=True)
class Stability:
    """`until_stable`: a step goes on, window by window (each `step_duration` long), until its
    last `windows` windows agree within `within` (throughput and p99, each against their
    mean), or until `max_s`; as perf_analyzer's stability percentage."""

    within: float  # a fraction: 0.05 for 5%
    windows: int = 3
    max_s: float = 60.0
    # a step that never settles fails the run (as perf_analyzer fails it) unless this is set
    allow_unstable: bool = False


@dataclass(frozen=True, kw_only=True)
class ConcurrencyLoad:
    """Closed loop: N users, each sending its next request when the last one answered."""

    levels: tuple[int, ...]
    step_duration_s: float
    warmup_s: float
    spec: str
    stable: Stability | None = None


@dataclass(frozen=True, kw_only=True)
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
    stable: Stability | None = None


@dataclass(frozen=True, kw_only=True)
class ReplayLoad:
    """Open loop from recorded traffic (scenario/traffic.py): each request sent at its offset
    in the file divided by the step's speed, for the template its model maps to (ANY: the
    mix picks), free of coordinated omission as a rate is; one step per speed."""

    traffic: Any  # scenario/traffic.py Traffic
    levels: tuple[float, ...]  # speeds: 2 replays twice as fast (half the duration)
    warmup_s: float
    spec: str
    templates: tuple[str, ...] = ()  # the template of each of traffic.models (ANY: the mix)
    loop: bool = False  # start the file again when it ends (then step_duration_s bounds it)
    times: int = 0  # looped: the file this many times whole, then stop (capacity's probes)
    step_duration_s: float = 0.0  # 0: the file's window at the step's speed
    sample_rate: int = 1
    max_concurrency: int = 0
    late_tolerance_s: float = 0.005
    stable: Stability | None = None  # never set: a replay is its file, not a steady state

    def duration_s(self, speed: float) -> float:
        return self.step_duration_s or self.traffic.duration_s / speed


ARRIVALS = ("constant", "poisson")
MAX_RATE = 1_000_000.0


@dataclass(frozen=True)
class Requirements:
    """What a phase needs from the host; unmet, the phase is skipped with a reason, not failed."""

    gpu: bool = False
    files: tuple[Path, ...] = ()


LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p999")
# decoupled (streaming) models: time to the first response, gaps between responses
STREAM_METRICS = tuple(f"{kind}_{p}" for kind in ("first_response", "inter_response")
                       for p in LATENCY_METRICS)
DURATION_METRICS = (*LATENCY_METRICS, *STREAM_METRICS)
# min_throughput in infer/s, goodput_min in good requests/s (the scenario's `goodput`)
AT_LEAST_METRICS = ("min_throughput", "goodput_min")
THRESHOLD_METRICS = (*DURATION_METRICS, "error_rate", "min_throughput", "max_dropped",
                     "goodput_min")


# `loadkit tune` objectives: bigger is better for these, smaller for every latency metric
MAXIMIZED = ("throughput", "goodput", "output_tokens_per_s")
STRATEGIES = ("brute", "quick", "bayes")


@dataclass(frozen=True, kw_only=True)
class Dimension:
    """One searched ModelConfig field of one model: its values, in the order written (`quick`
    starts at the first and climbs)."""

    model: str
    path: str  # dotted field path, e.g. dynamic_batching.max_queue_delay_microseconds
    values: tuple[Any, ...]
    where: str = ""  # file:line

    @property
    def name(self) -> str:
        return f"{self.model}.{self.path}"


@dataclass(frozen=True)
class Objective:
    """maximize/minimize one metric, or `weighted` gains over the baseline (metric -> weight)."""

    goal: str  # maximize | minimize | weighted
    metric: str = ""
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def text(self) -> str:
        if self.goal == "weighted":
            return "weighted " + ", ".join(f"{m} x{w:g}" for m, w in self.weights)
        return f"{self.goal} {self.metric}"


@dataclass(frozen=True, kw_only=True)
class TuneSpec:
    dimensions: tuple[Dimension, ...]
    load: ConcurrencyLoad | RateLoad
    objective: Objective
    constraints: tuple[Threshold, ...] = ()
    gpu_memory_bytes: int = 0  # a constraint on the server's GPU memory in use (0: none)
    strategy: str = "quick"
    budget_s: float = 0.0  # 0: no time limit
    budget_trials: int = 0  # 0: no trial limit
    seed: int = 0
    config: dict[str, dict[str, Any]] = field(default_factory=dict)  # on every trial, baseline too

    @property
    def grid_size(self) -> int:
        n = 1
        for d in self.dimensions:
            n *= len(d.values)
        return n


@dataclass(frozen=True)
class Goodput:
    """`goodput:` a streaming request is good when its first response, its mean gap between
    responses and its latency are each within their limit (µs; a missing one: no limit)."""

    first_response_us: float = float("inf")
    inter_response_us: float = float("inf")
    latency_us: float = float("inf")


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    name: str
    load: ConcurrencyLoad | RateLoad | ReplayLoad
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    requires: Requirements = Requirements()
    thresholds: Thresholds = Thresholds()
    mix: dict[str, float] = field(default_factory=dict)  # empty: the scenario's mix


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    path: Path
    target: TargetSpec
    requests: dict[str, RequestTemplate]
    mix: dict[str, float]
    think_time_s: float
    phases: tuple[PhaseSpec, ...]
    source: Source = field(repr=False, compare=False)
    goodput: Goodput | None = None
    tune: TuneSpec | None = None  # `loadkit tune`'s search (scenario/tune.py)
    # every phase measured `repeats` times in interleaved rounds; intervals and verdicts at
    # `confidence` (loadkit/stats.py, docs/verdicts.md)
    repeats: int = 1  # with `auto`: the most rounds (`max_repeats`)
    confidence: float = 0.95
    noise_threshold: float = 0.05  # the band inside which a change is `same` (loadkit/stats/)
    # `repeats: auto`: rounds are added until every comparison is decided, up to `repeats`
    # rounds and `max_time_s` of load (0: no time limit)
    auto: bool = False
    max_time_s: float = 0.0

    @property
    def models(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.requests.values():
            seen.setdefault(t.model, None)
            for m in t.composing:  # BLS: the models it calls must be loaded too
                seen.setdefault(m, None)
        for phase in self.phases:
            for model in phase.config:
                seen.setdefault(model, None)
        for dim in self.tune.dimensions if self.tune else ():
            seen.setdefault(dim.model, None)
        for model in self.tune.config if self.tune else ():
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
    if isinstance(value, str) and ENV_REF.search(value):
        return value  # the reference itself is not the secret
    if isinstance(value, str) and any(s and s in value for s in secrets):
        return "***"
    return value


def mixed_shapes(spec: InputSpec, n: int) -> list[tuple[int, ...]]:
    """n shapes in the weights' proportions (largest remainder), interleaved, so that any
    run of the pool is close to the mix."""
    total = sum(w for _, w in spec.shapes)
    counts = [int(n * w / total) for _, w in spec.shapes]
    order = sorted(range(len(counts)), key=lambda i: -(n * spec.shapes[i][1] / total - counts[i]))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    # interleave: entry k takes the shape whose share so far lags its weight the most
    out: list[tuple[int, ...]] = []
    given = [0] * len(counts)
    for k in range(n):
        i = max(range(len(counts)), key=lambda j: counts[j] * (k + 1) / n - given[j]
                if given[j] < counts[j] else -1e18)
        given[i] += 1
        out.append(spec.shapes[i][0])
    return out
