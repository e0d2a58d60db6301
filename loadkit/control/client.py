"""The control plane of one Triton server: readiness, metadata, statistics, model control.

Everything the drive stage must not do itself goes through here, over tritonclient's gRPC
client. Per-step server truth is a diff of two statistics snapshots; Triton restarts a model's
counters from zero when it is reloaded, so callers snapshot again after every config swap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadkit.control.metrics import MetricsSnapshot, scrape
from loadkit.control.reach import refused, unreachable_hint
from loadkit.errors import ControlError, TargetError, suggest
from loadkit.scenario import ModelInfo, TargetSpec
from loadkit.transport.channel import make_channel


@dataclass(frozen=True, kw_only=True)
class ModelCounters:
    """Cumulative counters of one model (all versions summed), as Triton reports them."""

    success: int = 0
    fail: int = 0
    inference_count: int = 0
    execution_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    batch_executions: dict[int, int] = field(default_factory=dict)


def _counters(entries: list[dict[str, Any]]) -> ModelCounters:
    vals: dict[str, int] = dict.fromkeys(
        (
            "success",
            "fail",
            "inference_count",
            "execution_count",
            "queue_ns",
            "compute_input_ns",
            "compute_infer_ns",
            "compute_output_ns",
            "cache_hits",
            "cache_misses",
        ),
        0,
    )
    batches: dict[int, int] = {}
    for e in entries:
        st = e.get("inference_stats", {})
        vals["success"] += int(st.get("success", {}).get("count", 0))
        vals["fail"] += int(st.get("fail", {}).get("count", 0))
        vals["cache_hits"] += int(st.get("cache_hit", {}).get("count", 0))
        vals["cache_misses"] += int(st.get("cache_miss", {}).get("count", 0))
        vals["inference_count"] += int(e.get("inference_count", 0))
        vals["execution_count"] += int(e.get("execution_count", 0))
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            vals[f"{key}_ns"] += int(st.get(key, {}).get("ns", 0))
        for b in e.get("batch_stats", []):
            size = int(b.get("batch_size", 0))
            batches[size] = batches.get(size, 0) + int(b.get("compute_infer", {}).get("count", 0))
    return ModelCounters(**vals, batch_executions=batches)


def diff_counters(before: ModelCounters, after: ModelCounters) -> dict[str, Any]:
    """One step's server-side view: counts, average batch and per-request times in us."""
    success = after.success - before.success
    execs = after.execution_count - before.execution_count
    infers = after.inference_count - before.inference_count

    def per_request_us(name: str) -> float:
        ns = getattr(after, name) - getattr(before, name)
        return round(ns / success / 1000.0, 1) if success > 0 else 0.0

    batch = {
        str(size): n - before.batch_executions.get(size, 0)
        for size, n in sorted(after.batch_executions.items())
        if n - before.batch_executions.get(size, 0) > 0
    }
    return {
        "success": success,
        "fail": after.fail - before.fail,
        "inference_count": infers,
        "exec_count": execs,
        "avg_batch": round(infers / execs, 3) if execs > 0 else 0.0,
        "queue_us": per_request_us("queue_ns"),
        "compute_input_us": per_request_us("compute_input_ns"),
        "compute_infer_us": per_request_us("compute_infer_ns"),
        "compute_output_us": per_request_us("compute_output_ns"),
        "batch_executions": batch,
        **({"cache_hits": after.cache_hits - before.cache_hits,
            "cache_misses": after.cache_misses - before.cache_misses}
           if after.cache_hits + after.cache_misses > before.cache_hits + before.cache_misses
           else {}),
    }


REFUSED_WAIT_S = 2.0  # a server that refuses connections this long is not about to start
SAY_AFTER_S = 1.0  # a wait longer than this is announced (a TLS mismatch ends before it)


def tls_hint(error: str, tls: bool, client_cert: bool) -> str:
    """What to check when a connection failed the way a TLS mismatch fails: grpc only says the
    socket closed (plaintext against TLS, or no client certificate for mutual TLS) or that the
    handshake failed."""
    if "handshake" in error.lower():
        return ": the TLS handshake failed; check target.tls.root_certs (the CA that signed the " \
            "server's certificate) and that the address matches the certificate"
    if "socket closed" not in error.lower():
        return ""
    if not tls:
        return ": if the server speaks TLS, set target.tls"
    if not client_cert:
        return ": if the server requires mutual TLS, set target.tls.client_cert and client_key"
    return ""


class ServerControl:
    """A gRPC control client for one server, on raw stubs over a channel we own.

    tritonclient's InferenceServerClient closes its channel again in __del__; under gevent that
    second close can deadlock at interpreter exit, so the control plane uses the service stubs
    directly and closes its channel exactly once.
    """

    door = "gRPC"

    def __init__(
        self, address: str, target: TargetSpec | None = None, metrics_url: str | None = None
    ):
        self.address = address
        target = target or TargetSpec()
        self.metrics_url = metrics_url or target.metrics
        self.metadata = tuple(target.headers) or None
        self.tls = target.tls
        self.channel = make_channel(address, target)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ServerControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise ControlError(exc.details() or exc.code().name, exc.code().name) from None

    def rpc(self, method: str, request: Any, timeout_s: float) -> Any:
        """One call of the inference service (ControlError with the server's words)."""
        return self._call(method, request, timeout_s)

    def is_live(self, timeout_s: float = 1.0) -> bool:
        """False only when the server cannot be reached at all (refused, reset): a stalled or
        overloaded server that answers late is slow, not lost."""
        try:
            self.stub.ServerLive(
                service_pb2.ServerLiveRequest(), timeout=timeout_s, metadata=self.metadata
            )
        except grpc.RpcError as exc:
            return exc.code() != grpc.StatusCode.UNAVAILABLE
        return True

    def wait_live(self, timeout_s: float = 10.0,
                  say: Callable[[str], None] = lambda _text: None) -> None:
        """Wait for the server to say it is live. A connection refused is retried for 2 s (a
        server just starting), anything else until timeout_s, saying once (after a second)
        what it waits for;
        a failure that looks like TLS or HTTP three times running is not retried (it will not
        change, and the user should hear why at once)."""
        start = time.monotonic()
        last, said = "", False
        fixed = 0
        while time.monotonic() - start < timeout_s:
            try:
                if self.live():
                    return
            except ControlError as exc:
                if not said and time.monotonic() - start > SAY_AFTER_S:
                    said = True  # a wait the user would notice: say what it waits for
                    say(f"waiting up to {timeout_s:g} s for Triton at {self.address} to answer "
                        f"{self.door} ({exc})")
                last = str(exc)
                hint = tls_hint(last, self.tls is not None, bool(self.tls and self.tls.client_cert))
                fixed = fixed + 1 if hint else 0
                if fixed >= 3 or refused(last) and time.monotonic() - start > REFUSED_WAIT_S:
                    break
            time.sleep(0.2)
        hint = unreachable_hint(self.address, last) or tls_hint(
            last, self.tls is not None, bool(self.tls and self.tls.client_cert))
        raise TargetError(f"Triton at {self.address} is not reachable over {self.door} "
                          f"({last or 'not live'}){hint}")

    def live(self) -> bool:
        """Whether the server says it is live (ControlError when it cannot be asked)."""
        return bool(self._call("ServerLive", service_pb2.ServerLiveRequest(), 2).live)

    def model_info(self, name: str) -> ModelInfo | str:
        """ModelInfo for a ready model, or the server's reason as a string."""
        if not self.model_ready(name):
            return self._why_not_ready(name)
        try:
            meta = self.metadata_of(name)
            cfg = self.config(name)
        except ControlError as exc:
            return str(exc)

        def tensors(items: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
            return {t["name"]: (t["datatype"], tuple(int(d) for d in t.get("shape", [])))
                    for t in items}

        return ModelInfo(
            name=name, max_batch_size=int(cfg.get("max_batch_size", 0)),
            inputs=tensors(meta.get("inputs", [])), outputs=tensors(meta.get("outputs", [])),
            decoupled=bool(cfg.get("model_transaction_policy", {}).get("decoupled", False)),
            sequence="sequence_batching" in cfg,
            composing=tuple(s.get("model_name", "") for s in
                            cfg.get("ensemble_scheduling", {}).get("step", [])),
            optional=frozenset(i["name"] for i in cfg.get("input", []) if i.get("optional")),
            corrid_type=corrid_type(cfg),
            backend=str(cfg.get("backend", "") or cfg.get("platform", "")),
        )

    def _why_not_ready(self, name: str) -> str:
        """The repository index's word on a model that is not ready: not in the repository
        (with the names it has, nearest first), failed to load (Triton's reason), or not
        loaded (explicit model control)."""
        try:
            index: list[dict[str, Any]] | None = self.index()
        except ControlError:
            index = None
        models = {m.get("name", ""): m for m in index} if index is not None else {}
        entry = models.get(name)
        if index is not None and entry is None:
            return (f"the repository has no model '{name}'{suggest(name, models)} (has: "
                    f"{', '.join(sorted(models)) or 'none'})")
        if entry is not None and entry.get("state") == "UNAVAILABLE" and entry.get("reason"):
            return f"it failed to load: {entry['reason']}"
        return "it is not loaded (explicit model control: load it first, or use the embedded " \
               "server)"

    # ---- the calls, one method each: what a control client over another door overrides ----
    def metadata_of(self, name: str) -> dict[str, Any]:
        meta = self._call("ModelMetadata", service_pb2.ModelMetadataRequest(name=name), 5)
        return MessageToDict(meta, preserving_proto_field_name=True)

    def index(self) -> list[dict[str, Any]]:
        index = self._call("RepositoryIndex", service_pb2.RepositoryIndexRequest(), 5)
        return [MessageToDict(m, preserving_proto_field_name=True) for m in index.models]

    def statistics(self, name: str) -> dict[str, Any]:
        resp = self._call("ModelStatistics", service_pb2.ModelStatisticsRequest(name=name), 10)
        return MessageToDict(resp, preserving_proto_field_name=True)

    def trace_settings(self, model: str, settings: dict[str, list[str]] | None = None
                       ) -> dict[str, list[str]]:
        """Trace settings that apply to `model` ('' for the server's), after setting
        `settings` when given (an empty list clears one back to the server's)."""
        request = service_pb2.TraceSettingRequest(model_name=model)
        for key, values in (settings or {}).items():
            request.settings[key].value.extend(values)
        resp = self._call("TraceSetting", request, 10)
        return {k: list(v.value) for k, v in resp.settings.items()}

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        """Tell the server about a system shared memory region (transport/shm.py)."""
        self._call("SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=0, byte_size=byte_size), 10)

    def unregister_system_shm(self, name: str) -> None:
        self._call("SystemSharedMemoryUnregister",
                   service_pb2.SystemSharedMemoryUnregisterRequest(name=name), 10)

    def system_shm_regions(self) -> list[str]:
        """The names of the system shared memory regions registered on the server."""
        resp = self._call("SystemSharedMemoryStatus",
                          service_pb2.SystemSharedMemoryStatusRequest(), 10)
        return list(resp.regions)

    def config(self, name: str) -> dict[str, Any]:
        resp = self._call("ModelConfig", service_pb2.ModelConfigRequest(name=name), 10)
        return MessageToDict(resp.config, preserving_proto_field_name=True)

    def read_counters(
        self, models: tuple[str, ...]
    ) -> tuple[dict[str, ModelCounters], dict[str, str]]:
        """(counters of the models whose statistics were read, {model: why not} for the rest):
        a failed read is never taken for zeros."""
        out: dict[str, ModelCounters] = {}
        missing: dict[str, str] = {}
        for name in models:
            try:
                stats = self.statistics(name)
            except ControlError as exc:
                missing[name] = f"statistics unavailable ({exc})"
                continue
            out[name] = _counters(stats.get("model_stats", []))
        return out, missing

    def counters(self, models: tuple[str, ...]) -> dict[str, ModelCounters]:
        """Every model's counters; ControlError when one cannot be read."""
        out, missing = self.read_counters(models)
        if missing:
            raise ControlError("; ".join(f"{m}: {why}" for m, why in missing.items()))
        return out

    def load(self, name: str, config: dict[str, Any] | None = None,
             timeout_s: float = 300.0) -> None:
        req = service_pb2.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            req.parameters["config"].string_param = json.dumps(config)
        self._call("RepositoryModelLoad", req, timeout_s)

    def unload(self, name: str) -> None:
        self._call(
            "RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(model_name=name), 60
        )

    def metrics(self) -> MetricsSnapshot:
        if not self.metrics_url:
            return MetricsSnapshot(error="no metrics endpoint configured (target.metrics)")
        return scrape(self.metrics_url)

    def model_ready(self, name: str) -> bool:
        try:
            return bool(self._call("ModelReady", service_pb2.ModelReadyRequest(name=name), 5).ready)
        except ControlError:
            return False


def corrid_type(config: dict[str, Any]) -> str:
    """The correlation id's data type a sequence batcher declares ("UINT64", "STRING"), ""
    when it declares no CONTROL_SEQUENCE_CORRID input."""
    for control_input in config.get("sequence_batching", {}).get("control_input", []):
        for control in control_input.get("control", []):
            if control.get("kind") == "CONTROL_SEQUENCE_CORRID":
                return str(control.get("data_type", "")).removeprefix("TYPE_")
    return ""
