"""Pure units of the run stage, with small fakes of their collaborators (no server, no Locust):
the controller's outcomes and events, building a step's result (accounting included), and the
conductor's walk (windows, snapshots, verdict). The end-to-end tests prove the same against the
real Triton; these pin the logic down in milliseconds (`make test-fast`)."""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import write

from loadkit.control.client import ModelCounters
from loadkit.control.controller import Controller, Snapshot
from loadkit.control.metrics import MetricsSnapshot
from loadkit.errors import ControlError
from loadkit.events import ConfigApplied, EventLog, RunEvent
from loadkit.plan import Plan, Step, build_plan
from loadkit.record import StepWindow
from loadkit.run.conductor import Conductor
from loadkit.run.drive import Collected
from loadkit.run.results import RunResult
from loadkit.run.step_result import StepContext, build_step_result
from loadkit.scenario import Scenario, load_scenario

pytestmark = pytest.mark.fast

DENSE = {"name": "dense", "max_batch_size": 8, "backend": "python"}


class FakeControl:
    """ServerControl's control-plane calls, on a dict of configs; `refuse` names models whose
    load fails as Triton refuses a config."""

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.configs = {"dense": dict(DENSE)}
        self.refuse = set(refuse)
        self.loads: list[tuple[str, dict[str, Any]]] = []

    def config(self, model: str) -> dict[str, Any]:
        return copy.deepcopy(self.configs[model])

    def load(self, model: str, config: dict[str, Any], timeout_s: float) -> None:
        self.loads.append((model, config))
        if model in self.refuse:
            raise ControlError("load failed for model 'dense': bad config", "INVALID_ARGUMENT")
        self.configs[model] = copy.deepcopy(config)

    def model_ready(self, model: str) -> bool:
        return True

    def metrics(self) -> MetricsSnapshot:
        return MetricsSnapshot()

    def is_live(self) -> bool:
        return True


SCENARIO = """
name: units
requests:
  d:
    model: dense
    inputs:
      INPUT0: {dtype: FP32, shape: [4]}
phases:
  - name: base
    load: {concurrency: [1, 2], step_duration: 0.05s, warmup: 0s}
  - name: batched
    config:
      dense: {dynamic_batching: {max_queue_delay_microseconds: 100}}
    load: {concurrency: [1], step_duration: 0.05s, warmup: 0s}
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    return load_scenario(write(tmp_path / "s.yaml", SCENARIO))


def _window(step: Step, successes: int, errors: int = 0) -> StepWindow:
    w = StepWindow(step=step)
    for i in range(successes):
        w.record("d", 100 + i)
    for _ in range(errors):
        w.error("d", "UNAVAILABLE", "connection refused")
    w.sent = successes + errors
    return w


def _context(step: Step, got: Collected, before: Snapshot | None, after: Snapshot | None,
             duration_s: float, status: str, batch: int) -> StepContext:
    return StepContext(step=step, got=got, before=before, after=after, started_at="t",
                       duration_s=duration_s, status=status, batch_sizes={"d": batch},
                       calls={"d": {"dense": 1}})


def _snapshot(success: int) -> Snapshot:
    return Snapshot({"dense": ModelCounters(success=success, inference_count=success,
                                            execution_count=success)}, MetricsSnapshot())


# ---- the controller --------------------------------------------------------------------------
def test_controller_returns_outcomes_and_says_them_as_events(scenario: Scenario) -> None:
    plan = build_plan(scenario)
    events = EventLog()
    heard: list[RunEvent] = []
    events.added.add_listener(lambda event, _data: heard.append(event))
    control = FakeControl()
    ctl = Controller(control, ("dense",), events)  # type: ignore[arg-type]

    first = ctl.apply_phase(plan.phases[0])
    assert (first.status, first.reason, first.reload_s) == ("ok", "", {})  # nothing to change
    assert control.loads == []
    second = ctl.apply_phase(plan.phases[1])
    assert second.status == "ok" and set(second.reload_s) == {"dense"}
    assert second.config["dense"]["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    assert [type(e) for e in heard] == [ConfigApplied]
    assert events.items[0]["event"] == "config_applied"
    assert events.items[0]["phase"] == "batched" and events.items[0]["model"] == "dense"

    assert ctl.restore() == []
    assert control.configs["dense"] == DENSE  # back to what it was before the run
    assert events.items[-1] == {"at": events.items[-1]["at"], "event": "config_restored",
                                "model": "dense"}


def test_a_refused_config_fails_the_phase_with_the_servers_words(scenario: Scenario) -> None:
    plan = build_plan(scenario)
    events = EventLog()
    ctl = Controller(FakeControl(refuse=("dense",)), ("dense",), events)  # type: ignore[arg-type]
    out = ctl.apply_phase(plan.phases[1])
    assert out.status == "failed"
    assert "bad config" in out.reason
    assert events.named("config_rejected")[0]["detail"].endswith("bad config")
    assert ctl.applied == {}  # Triton stays on its last good config: nothing to restore
    assert ctl.restore() == []


def test_a_restore_that_fails_is_returned_not_swallowed(scenario: Scenario) -> None:
    plan = build_plan(scenario)
    control = FakeControl()
    ctl = Controller(control, ("dense",), EventLog())  # type: ignore[arg-type]
    assert ctl.apply_phase(plan.phases[1]).status == "ok"
    control.refuse.add("dense")
    failures = ctl.restore()
    assert [f["model"] for f in failures] == ["dense"]
    assert "batched" in failures[0]["left_on"] and "bad config" in failures[0]["detail"]


# ---- one step's result -----------------------------------------------------------------------
def test_step_result_accounts_client_against_server(scenario: Scenario) -> None:
    step = build_plan(scenario).steps[0]
    got = Collected(window=_window(step, 40, errors=2), drained=True, cpu_s=0.5, rss_bytes=1 << 20)
    ok = build_step_result(_context(step, got, _snapshot(100), _snapshot(140), 2.0, "ok", 4))
    assert (ok.requests, ok.inferences, ok.throughput) == (40, 160, 80.0)
    assert ok.errors == {"UNAVAILABLE": 2}
    assert ok.error_messages["UNAVAILABLE"] == [{"message": "connection refused", "count": 2}]
    assert ok.server["dense"]["success"] == 40
    assert ok.accounting["status"] == "ok"

    bad = build_step_result(_context(step, got, _snapshot(100), _snapshot(139), 2.0, "ok", 4))
    assert bad.accounting["status"] == "mismatch"
    assert "40" in bad.accounting["reason"] and "39" in bad.accounting["reason"]


def test_an_undeclared_bls_call_stays_a_mismatch_with_a_hint(tmp_path: Path) -> None:
    """A python model in the mix may call another model from its code; loadkit cannot know,
    so an excess on the server stays a mismatch (a broken invariant fails the run), with the
    declaration that would explain it; declared, the model is unchecked with why."""
    from loadkit.run.accounting import check_step, template_calls

    step = build_plan(load_scenario(write(tmp_path / "s.yaml", """
requests:
  d: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
  b: {model: bls_dense, inputs: {INPUT0: {dtype: FP32, shape: [1, 256]}}}
phases: [{name: x, load: {concurrency: 1, step_duration: 1s}}]
"""))).steps[0]
    w = _window(step, 40)
    for i in range(10):
        w.record("b", 100 + i)
    w.sent = 50
    server = {"dense": {"success": 50}, "bls_dense": {"success": 10}}
    models = {"d": "dense", "b": "bls_dense"}
    undeclared = template_calls(models, {}, {}, {"d": True, "b": True})
    acc = check_step(w, undeclared, server, {}, False)
    assert acc["status"] == "mismatch", acc
    assert "declare composing_models: [dense]" in acc["reason"], acc["reason"]
    declared = template_calls(models, {"b": ("dense",)}, {"b": False}, {"d": True, "b": True})
    acc = check_step(w, declared, server, {}, False)
    assert acc["status"] == "unchecked", acc
    assert "BLS" in acc["unchecked"][0] and acc["unchecked"][0].startswith("dense:"), acc


def test_step_result_without_server_counters_is_unchecked_never_zero(scenario: Scenario) -> None:
    step = build_plan(scenario).steps[0]
    got = Collected(window=_window(step, 5), drained=True, cpu_s=0.1, rss_bytes=0)
    r = build_step_result(_context(step, got, None, None, 1.0, "partial", 1))
    assert r.server == {}
    assert "could not be read before the step" in r.server_unavailable["dense"]
    assert r.accounting["status"] == "unchecked"


# ---- the conductor ---------------------------------------------------------------------------
class FakeDrive:
    """The Drive protocol over scripted windows: each measured window gets `per_step`
    successes; `calls` records the conductor's begin/end order."""

    def __init__(self, per_step: int):
        self.per_step = per_step
        self.calls: list[str] = []
        self.step: Step | None = None
        self.record = False

    def attach(self, environment: Any) -> None: ...

    def users_for(self, step: Step) -> int:
        return step.concurrency

    def missing_senders(self) -> str:
        return ""

    def begin(self, step: Step, record: bool, arrivals: Any = None) -> None:
        self.calls.append(f"begin {step.key} {'measure' if record else 'warm-up'}")
        self.step, self.record = step, record

    def end(self, timeout_s: float) -> Collected | None:
        self.calls.append("end")
        if not self.record or self.step is None:
            return None
        self.record = False
        return Collected(window=_window(self.step, self.per_step), drained=True, cpu_s=0.01,
                         rss_bytes=0)

    def end_sequences(self, timeout_s: float, every: bool) -> int:
        if every:
            self.calls.append("end sequences")
        return 0

    def in_flight(self) -> int | None:
        return None

    def live_window(self) -> StepWindow | None:
        return None

    def stop(self) -> None: ...


class FakeController:
    """Counters that advance by `server_per_step` between the snapshots around each window."""

    def __init__(self, server_per_step: int, refuse_phase: str = ""):
        self.success = 0
        self.server_per_step = server_per_step
        self.refuse_phase = refuse_phase
        self.snapshots = 0
        self.applied: dict[str, Any] = {}

    def apply_phase(self, phase: Any) -> Any:
        from loadkit.control.controller import PhaseOutcome

        if phase.name == self.refuse_phase:
            return PhaseOutcome(status="failed", reason="dense: refused")
        return PhaseOutcome()

    def snapshot(self) -> Snapshot:
        self.snapshots += 1
        if self.snapshots % 2 == 0:  # after a window
            self.success += self.server_per_step
        return _snapshot(self.success)

    def server_live(self) -> bool:
        return True

    def metrics(self) -> MetricsSnapshot:
        return MetricsSnapshot(error="no metrics in this unit")

    watched = ("dense",)

    def restore(self) -> list[dict[str, str]]:
        return []


class FakeHub:
    def __init__(self, scenario: Scenario, drive: FakeDrive, controller: FakeController):
        self.scenario = scenario
        self.plan: Plan = build_plan(scenario)
        self.result = RunResult(scenario_name=scenario.name, scenario={}, target="127.0.0.1:1",
                                embedded=False, started_at="t")
        self.events = EventLog(self.result.events)
        self.controller = controller
        self.drive = drive
        self.environment = types.SimpleNamespace(runner=None)  # no Locust runner to wait for
        self.batch_sizes = {"d": 1}
        self.template_models = {"d": "dense"}
        self.template_calls: dict[str, dict[str, int | None]] = {"d": {"dense": 1}}
        self.composing: dict[str, str] = {}
        self.input_tokens: dict[str, tuple[float, str]] = {}
        self.saves = 0

    def save(self, final: bool = False) -> None:
        self.saves += 1


def _walk(hub: FakeHub) -> Conductor:
    conductor = Conductor(hub)  # type: ignore[arg-type]
    conductor.start()
    assert conductor.finished.wait(10), "the conductor did not finish"
    return conductor


def test_a_failure_while_finishing_ends_the_run_loudly(scenario: Scenario) -> None:
    """A bug in the final save (it once raised on a new threshold metric) must not leave the
    run waiting forever: the conductor finishes, aborted, exit 1, with the reason."""
    drive = FakeDrive(per_step=25)
    hub = FakeHub(scenario, drive, FakeController(server_per_step=25))

    def save(final: bool = False) -> None:
        if final and hub.result.status != "aborted":
            raise ValueError("unknown metric first_response_p99")

    hub.save = save  # type: ignore[method-assign]
    conductor = _walk(hub)
    assert conductor.exit_code == 1
    assert hub.result.status == "aborted" and "unknown metric" in hub.result.reason


def test_conductor_measures_each_step_between_drained_snapshots(scenario: Scenario) -> None:
    drive = FakeDrive(per_step=25)
    hub = FakeHub(scenario, drive, FakeController(server_per_step=25))
    conductor = _walk(hub)
    assert hub.result.status == "complete", hub.result.reason
    assert conductor.exit_code == 0
    steps = [s for p in hub.result.phases for s in p.steps]
    assert [s.requests for s in steps] == [25, 25, 25]
    assert all(s.accounting["status"] == "ok" for s in steps)
    # warm-up (0 s here) then a measured window, each closed before the next opens
    assert drive.calls[:4] == ["begin base/0 warm-up", "end", "begin base/0 measure", "end"]
    assert hub.controller.snapshots == 6  # before and after each of the 3 windows


def test_conductor_fails_a_run_whose_counts_do_not_add_up(scenario: Scenario) -> None:
    hub = FakeHub(scenario, FakeDrive(per_step=25), FakeController(server_per_step=24))
    conductor = _walk(hub)
    assert hub.result.status == "failed"
    assert "accounting" in hub.result.reason
    assert conductor.exit_code == 1
    assert len(hub.events.named("accounting_mismatch")) == 3


def test_conductor_skips_the_steps_of_a_refused_phase_and_fails_the_run(
        scenario: Scenario) -> None:
    hub = FakeHub(scenario, FakeDrive(per_step=5),
                  FakeController(server_per_step=5, refuse_phase="batched"))
    conductor = _walk(hub)
    phases = {p.name: p for p in hub.result.phases}
    assert phases["batched"].status == "failed" and phases["batched"].steps == []
    assert phases["batched"].reason == "dense: refused"
    assert len(phases["base"].steps) == 2
    assert hub.result.status == "failed" and conductor.exit_code == 1
    assert "batched" in hub.result.reason


def test_results_json_keeps_its_format_name() -> None:
    """results.json's `format` is read by `loadkit report`/`compare` and by users' tooling:
    moving the module that writes it must not rename it."""
    assert RunResult(scenario_name="n", scenario={}, target="a", embedded=False,
                     started_at="t").to_json()["format"] == "loadkit.results/1"


def test_the_servers_own_words_go_before_the_other_messages_bucket() -> None:
    """When every failure says something different (a correlation id in each text), the bucket
    of the rest is the largest; the summary still quotes a real message."""
    from loadkit.record import OTHER_MESSAGES
    from loadkit.run.accounting import first_message

    kept = {"INFER_ERROR": [{"message": "sequence 7 must START first", "count": 1},
                            {"message": OTHER_MESSAGES, "count": 900}]}
    assert first_message(kept) == "INFER_ERROR: sequence 7 must START first"
    assert first_message({"X": [{"message": OTHER_MESSAGES, "count": 3}]}) == \
        f"X: {OTHER_MESSAGES}"


@pytest.mark.fast
def test_a_failing_event_listener_breaks_neither_the_caller_nor_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    events = EventLog()
    heard: list[str] = []

    def broken(event: RunEvent, _data: dict[str, Any]) -> None:
        raise RuntimeError("the web UI went away")

    events.added.add_listener(broken)
    events.added.add_listener(lambda event, _data: heard.append(event.name))
    data = events.add(ConfigApplied(phase="p", model="dense", reload_s=0.5))  # does not raise
    assert data["event"] == "config_applied" and heard == ["config_applied"]
    assert "an event listener failed on config_applied" in caplog.text
