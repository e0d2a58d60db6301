"""The target a run talks to, set up the same way for `loadkit run` and for plain `locust -f`:
the embedded Triton when no address is given, the control client, the scenario checked against
the models the server really has (and completed with what it says about them)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from loadkit.control.client import ServerControl
from loadkit.control.embedded import EmbeddedServer
from loadkit.control.http_client import connect
from loadkit.control.shared_memory import check_local, sweep
from loadkit.control.shared_memory import refuse as refuse_shared_memory
from loadkit.errors import TargetError
from loadkit.scenario import (
    Scenario,
    checked_against,
    composing_models,
    decoupled_models,
    scripted_models,
    unbatched_models,
    with_model_facts,
)


def default_out(name: str) -> Path:
    """reports/<UTC timestamp>-<scenario name>/"""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("reports") / f"{stamp}-{name}"


def refuse_over_http(scenario: Scenario, address: str, infos: dict[str, object]) -> None:
    """What a door cannot carry, refused before anything is sent: the generate extension is
    HTTP's; a decoupled model's responses come over gRPC streams or HTTP's generate_stream
    (server-sent events), not HTTP's infer (one response per request)."""
    http = address.startswith(("http://", "https://"))
    for t in scenario.requests.values():
        decoupled = getattr(infos.get(t.model), "decoupled", False)
        if t.endpoint != "infer" and not http:
            raise TargetError(f"request template '{t.name}': endpoint: {t.endpoint} is Triton's "
                              f"HTTP generate extension; {address} is reached over gRPC: give "
                              "an http:// target (Triton's HTTP port, usually 8000)")
        if http and decoupled and t.endpoint == "infer":
            raise TargetError(f"request template '{t.name}': model {t.model} is decoupled "
                              "(several responses per request): over HTTP/REST an infer request "
                              "gets one response; set endpoint: generate_stream on the template "
                              "(Triton's generate extension, server-sent events), or send over "
                              "gRPC (a host:port target without http://)")
        if decoupled and t.endpoint == "generate":
            raise TargetError(f"request template '{t.name}': model {t.model} is decoupled; "
                              "generate expects exactly one response: use endpoint: "
                              "generate_stream")
    if http and scenario.target.transport != "stream":
        raise TargetError(f"target.transport: {scenario.target.transport} chooses between "
                          f"gRPC's calls; {address} is reached over HTTP, where every request "
                          "is one call: remove it")


class Session:
    """Server (if embedded), control client and the checked scenario; `close()` stops both."""

    def __init__(
        self,
        scenario: Scenario,
        address: str | None,
        metrics_url: str | None = None,
        log_path: Path | None = None,
        say: Callable[[str], None] = lambda _text: None,
        live_timeout_s: float = 10.0,
    ):
        self.server: EmbeddedServer | None = None
        self.control: ServerControl | None = None
        self.shared_memory = scenario.target.shared_memory == "system"
        try:
            if address and "://" not in address and scenario.target.protocol == "http":
                address = f"http://{address}"  # the scenario (or -i http) names the door
            if not address:
                say(f"starting the embedded Triton for models {', '.join(scenario.models)} ...")
                self.server = EmbeddedServer(models=scenario.models, log_path=log_path).start()
                address = self.server.grpc_address
                if scenario.target.protocol == "http":
                    address = f"http://{self.server.http_address}"
                say(f"embedded Triton ready: {address}, metrics {self.server.metrics_url}")
            self.address: str = address
            if self.shared_memory:
                check_local(address)  # before a byte goes to a host that cannot share memory
            metrics = metrics_url or (self.server.metrics_url if self.server else None)
            self.control = connect(address, scenario.target, metrics)
            self.control.wait_live(timeout_s=live_timeout_s, say=say)
            infos = {m: self.control.model_info(m) for m in scenario.models}
            self.infos = infos
            scenario = checked_against(scenario, infos)
            refuse_over_http(scenario, address, infos)
            refuse_shared_memory(scenario, address, infos)
            if scenario.target.shared_memory == "system":
                sweep(self.control)  # what a killed run left
            self.scenario = with_model_facts(scenario, unbatched_models(infos),
                                             composing_models(infos), decoupled_models(infos),
                                             scripted_models(infos))
        except BaseException:
            self.close()
            raise

    @property
    def embedded(self) -> bool:
        return self.server is not None

    def close(self, log_copy: Path | None = None) -> None:
        if self.control is not None:
            if self.shared_memory:
                sweep(self.control, mine=True)  # a worker killed, a drive not stopped
            self.control.close()
            self.control = None
        if self.server is not None:
            if log_copy is not None:
                self.server.copy_log(log_copy)
            self.server.stop()
            self.server = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
