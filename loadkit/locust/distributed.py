"""Distributed runs on Locust's own master/worker mechanism.

The master runs the conductor and the controller and sends nothing to Triton; workers only send.
Step boundaries stay as exact as in one process because the same gate is used, carried by Locust
messages: the master sends `loadkit_open` (which step, warm-up or measured, each worker's share of
an open-loop rate) and `loadkit_close`; each worker closes its gate, waits for what it has in
flight, and answers `loadkit_closed` with its whole window (encoded HDR histograms, error counts,
CPU). The master merges the windows with decode_and_add, so a step's count is the sum of the
workers' counts, which the server's success delta matches. Live views ride on Locust's periodic
worker report (`report_to_master`). A worker that stops answering is reported with its users and
the steps it is missing from; the run goes on with the rest.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust.runners import STATE_MISSING

from loadkit import __version__
from loadkit.clock import utcnow
from loadkit.errors import LoadkitError
from loadkit.events import (
    EventLog,
    WorkerJoined,
    WorkerLost,
    WorkerRefused,
    WorkerReportTimeout,
)
from loadkit.loads.sequence import most_open, slice_ids
from loadkit.locust.local_drive import LocalDrive
from loadkit.plan import Arrivals, Plan, Step, build_plan
from loadkit.record import StepWindow
from loadkit.run.drive import Collected
from loadkit.scenario import Scenario, with_inputs, with_model_facts

log = logging.getLogger("loadkit.distributed")

HELLO, SETUP, OPEN, CLOSE, CLOSED, REFUSED, END_SEQ, ENDED_SEQ = (
    "loadkit_hello", "loadkit_setup", "loadkit_open", "loadkit_close", "loadkit_closed",
    "loadkit_refused", "loadkit_end_sequences", "loadkit_sequences_ended",
)
REPLY_GRACE_S = 10.0  # beyond the drain time, for the message round trip and a slow worker
WATCH_S = 0.5
SEED_STRIDE = 100_003  # worker i's schedule seed: seed + i * stride (worker 0 = one process)


def fingerprint(scenario: Scenario, plan: Plan) -> dict[str, str]:
    """What master and workers must agree on, field by field: the plan's loads, the request
    templates and the bytes they send, the mix, the thresholds' values. Never a file path (a
    worker is handed the absolute path of a file the user typed relative), nor the config
    overlays (only the master applies them)."""
    out: dict[str, str] = {}

    def put(key: str, value: object) -> None:
        data = value if isinstance(value, bytes) else repr(value).encode()
        out[key] = hashlib.sha256(data).hexdigest()[:16]

    put("mix", [sorted(p.mix.items()) for p in plan.phases])
    put("think_time", scenario.think_time_s)
    put("target", (scenario.target.timeout_s, scenario.target.transport))
    put("loadkit", __version__)  # the same version serializes the same bytes
    for name, t in sorted(scenario.requests.items()):
        put(f"requests.{name}", (t.model, t.version, t.batch_size, t.batched, t.outputs,
                                 t.order, t.parameters))
        # what the requests' bytes are made of (the pools are built by the senders only)
        put(f"requests.{name}.bytes", (t.inputs, t.pool, t.sequence, t.llm, t.cancel,
                                       _digest(t.dataset.file) if t.dataset else None))
    put("phases", [p.name for p in plan.phases])
    for p in plan.phases:
        put(f"phases.{p.name}.load",
            [(s.concurrency, s.warmup_s, s.duration_s, s.arrivals) for s in p.steps])
        put(f"phases.{p.name}.thresholds",
            ([(t.metric, t.limit, t.template) for t in p.thresholds.items],
             p.thresholds.abort_on_fail))
    return out


def _digest(path: Path) -> str:
    """A data set's content (a file, or a folder's files in name order)."""
    h = hashlib.sha256()
    for f in sorted(path.iterdir()) if path.is_dir() else [path]:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def first_difference(mine: dict[str, str], theirs: dict[str, str]) -> str | None:
    """The first field (in the master's order) where two fingerprints differ, or None."""
    for key in [*theirs, *(k for k in mine if k not in theirs)]:
        if mine.get(key) != theirs.get(key):
            return key
    return None


def share(a: Arrivals, users: int, total: int, index: int) -> dict[str, Any]:
    """One worker's part of an open-loop rate, proportional to its users."""
    cap = math.ceil(a.max_concurrency * users / total) if a.max_concurrency else 0
    return {
        "rate": a.rate * users / total,
        "arrival": a.arrival,
        "seed": a.seed + index * SEED_STRIDE,
        "max_concurrency": cap,
        "late_tolerance_s": a.late_tolerance_s,
    }


class MasterDrive:
    """The conductor's drive on a Locust master (run/drive.py's Drive protocol)."""

    def __init__(self, scenario: Scenario, plan: Plan, address: str, events: EventLog):
        self.scenario = scenario
        self.plan = plan
        # each worker gets its own run of correlation ids, as many as it may hold open
        self.id_slice = 0
        if any(t.sequence is not None for t in scenario.requests.values()):
            self.id_slice = most_open(scenario)
            if not self.id_slice:
                raise LoadkitError(
                    "templates with a 'sequence' in an open-loop phase without max_concurrency "
                    "cannot run distributed: each worker needs its own correlation ids, as many "
                    "as it may hold open; expected max_concurrency on every rate phase")
        if any(s.arrivals is not None and s.arrivals.replay is not None for s in plan.steps):
            raise LoadkitError("a 'replay' load runs in one process for now (each worker would "
                               "need its share of the file's arrivals); run it without "
                               "--workers / --master")
        self._slots: dict[str, int] = {}  # worker -> its id slice, in order of arrival
        self.fingerprint = fingerprint(scenario, self.plan)
        self.unbatched = sorted({t.model for t in scenario.requests.values() if not t.batched})
        self.decoupled = sorted({t.model for t in scenario.requests.values() if t.decoupled})
        # templates completed from the model's metadata: workers complete theirs the same way
        self.filled = {n: t.filled for n, t in scenario.requests.items() if t.filled}
        self.address = address
        self.events = events
        self.refused: dict[str, str] = {}  # worker -> why it did not join
        self.timeout_s = scenario.target.timeout_s
        self.runner: Any = None
        self.seq = 0
        self.step: Step | None = None
        self.recording = False
        self._expected: dict[str, int] = {}
        self._replies: dict[str, dict[str, Any]] = {}
        self._live: dict[str, dict[str, Any]] = {}
        self._reply = Event()
        self._users_seen: dict[str, int] = {}
        self._lost: dict[str, str] = {}  # worker -> when it was lost
        self._watch: gevent.Greenlet | None = None

    def attach(self, environment: Any) -> None:
        """Handlers are registered once per Locust process and find the current run's drive
        through `environment.loadkit`, since the web UI starts a new run for every test."""
        self.runner = runner = environment.runner
        if HELLO not in runner.custom_messages:
            drive = lambda: environment.loadkit.drive  # noqa: E731
            runner.register_message(HELLO, lambda **kw: drive()._on_hello(**kw))
            runner.register_message(CLOSED, lambda **kw: drive()._on_closed(**kw))
            runner.register_message(REFUSED, lambda **kw: drive()._on_refused(**kw))
            runner.register_message(ENDED_SEQ, lambda **kw: drive()._on_closed(**kw))
            environment.events.worker_report.add_listener(
                lambda **kw: drive()._on_report(**kw)
            )
        self._watch = gevent.spawn(self._watch_loop)

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.kill(block=False)
            self._watch = None

    # ---- Locust message handlers (master greenlets) ----------------------------------------
    def _on_hello(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker's handlers are registered only once it is connected, so it asks."""
        self.runner.send_message(
            SETUP,
            {"address": self.address, "fingerprint": self.fingerprint,
             "unbatched": self.unbatched, "decoupled": self.decoupled, "filled": self.filled,
             "id_slice": [self._slots.setdefault(msg.node_id, len(self._slots)),
                          self.id_slice]},
            client_id=msg.node_id,
        )
        self.events.add(WorkerJoined(msg.node_id))

    def _on_refused(self, environment: Any, msg: Any, **_: Any) -> None:
        self.refused[msg.node_id] = msg.data.get("reason", "")
        log.error("worker %s refused: %s", msg.node_id, self.refused[msg.node_id])
        self.events.add(WorkerRefused(msg.node_id, msg.data.get("reason", "")))

    def _on_closed(self, environment: Any, msg: Any, **_: Any) -> None:
        if msg.data.get("seq") == self.seq:
            self._replies[msg.node_id] = msg.data
            self._reply.set()

    def _on_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        live = data.get("loadkit")
        if live and live.get("seq") == self.seq:
            self._live[client_id] = live["window"]

    def _watch_loop(self) -> None:
        """Notice workers that stop sending heartbeats (Locust marks them missing)."""
        while True:
            gevent.sleep(WATCH_S)
            alive = self.workers()
            for worker, users in list(self._users_seen.items()):
                if worker not in alive and worker not in self._lost:
                    self._lost[worker] = utcnow()
                    self.events.add(WorkerLost(at=self._lost[worker], worker=worker, users=users,
                                               step=self.step.key if self.step else None))
                    log.warning("worker %s lost with %d users", worker, users)
            for worker, users in alive.items():
                if users:
                    self._users_seen[worker] = users

    # ---- the conductor's side ---------------------------------------------------------------
    def workers(self) -> dict[str, int]:
        """Connected workers (not missing) and the users each runs now."""
        if self.runner is None:
            return {}
        return {
            c.id: c.user_count for c in self.runner.clients.all
            if c.state != STATE_MISSING and c.id not in self.refused
        }

    def missing_senders(self) -> str:
        """Why no load could be sent now ('' when some worker can send)."""
        if self.workers():
            return ""
        refused = "; ".join(f"worker {w} refused: {why}" for w, why in self.refused.items())
        return "no Locust worker is connected to send load" + (f" ({refused})" if refused
                                                                else "")

    def users_for(self, step: Step) -> int:
        """Closed loop: the step's users, spread by Locust. Open loop: one schedule per worker."""
        return step.concurrency if step.arrivals is None else max(1, len(self.workers()))

    def begin(self, step: Step, record: bool, arrivals: Arrivals | None = None) -> None:
        self.seq += 1
        self.step, self.recording = step, record
        active = {w: n for w, n in sorted(self.workers().items()) if n > 0}
        total = sum(active.values())
        a = arrivals or step.arrivals
        for i, (worker, users) in enumerate(active.items()):
            self.runner.send_message(
                OPEN,
                {"seq": self.seq, "record": record, "phase": step.phase_index,
                 "step": step.index, "arrivals": share(a, users, total, i) if a else None},
                client_id=worker,
            )
        self._expected, self._replies, self._live = active, {}, {}

    def end(self, timeout_s: float) -> Collected | None:
        """Close every worker's gate and wait for each answer (or its loss, or the timeout)."""
        for worker in self._expected:
            self.runner.send_message(CLOSE, {"seq": self.seq}, client_id=worker)
        deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
        while True:
            alive = self.workers()
            pending = [w for w in self._expected if w not in self._replies and w in alive]
            if not pending or time.monotonic() >= deadline:
                break
            self._reply.clear()
            self._reply.wait(0.05)
        lost = sorted(w for w in self._expected if w not in self._replies and w not in pending)
        if pending:
            self.events.add(WorkerReportTimeout(
                workers=pending, step=self.step.key if self.step else None,
                detail=f"no final report within {timeout_s + REPLY_GRACE_S:g} s"))
        was_recording, self.recording = self.recording, False
        if not was_recording or self.step is None:
            return None
        window = StepWindow(step=self.step)
        cpu, rss, in_flight, drained = 0.0, 0, 0, not pending and not lost
        for reply in self._replies.values():
            if reply["window"]:
                window.add_wire(reply["window"])
            cpu += reply["cpu_s"]
            rss += reply["rss_bytes"]
            in_flight += reply["in_flight"]
            drained = drained and reply["drained"]
        workers = {
            "count": len(self._expected),
            "users": dict(self._expected),
            "replied": sorted(self._replies),
            "requests": {w: r["requests"] for w, r in sorted(self._replies.items())},
            "lost": lost,
            "timed_out": pending,
        }
        return Collected(window=window, drained=drained, cpu_s=cpu, rss_bytes=rss,
                         in_flight=in_flight, workers=workers)

    def end_sequences(self, timeout_s: float, every: bool) -> int:
        """Every worker ENDs the sequences it may have left open (LocalDrive.end_sequences);
        the master waits for each answer (or its loss, or the timeout)."""
        if self.id_slice == 0 or self.runner is None:
            return 0
        self.seq += 1
        workers = sorted(self.workers())
        for worker in workers:
            self.runner.send_message(END_SEQ, {"seq": self.seq, "every": every},
                                     client_id=worker)
        self._replies = {}
        deadline = time.monotonic() + timeout_s + REPLY_GRACE_S
        while time.monotonic() < deadline:
            alive = self.workers()
            if all(w in self._replies or w not in alive for w in workers):
                break
            self._reply.clear()
            self._reply.wait(0.05)
        return sum(int(r.get("ended", 0)) for r in self._replies.values())

    def in_flight(self) -> int | None:
        return None  # the workers know theirs; the timeline's in-flight is local runs only

    def live_window(self) -> StepWindow | None:
        """The current step merged from the workers' last periodic reports (every ~3 s)."""
        if not self.recording or self.step is None:
            return None
        window = StepWindow(step=self.step)
        for wire in list(self._live.values()):
            window.add_wire(wire)
        return window


class WorkerAgent:
    """A worker's `environment.loadkit`: a local drive that follows the master's gate."""

    def __init__(self, environment: Any, scenario: Scenario, seed: int = 0):
        self.environment = environment
        self.file_scenario = scenario
        self.scenario = scenario
        self.plan: Plan | None = None  # built once the master's facts are known (SETUP)
        self.seed = seed
        self.address = ""
        self.drive: LocalDrive | None = None
        self.seq = 0
        runner = environment.runner
        runner.register_message(SETUP, self._on_setup)
        runner.register_message(OPEN, self._on_open)
        runner.register_message(CLOSE, self._on_close, concurrent=True)
        runner.register_message(END_SEQ, self._on_end_sequences, concurrent=True)
        environment.events.report_to_master.add_listener(self._on_report)
        environment.events.test_stop.add_listener(self._on_test_stop)
        environment.loadkit = self
        runner.send_message(HELLO, {})

    def _new_drive(self) -> LocalDrive:
        index = getattr(self.environment.runner, "worker_index", 0)
        drive = LocalDrive(self.scenario, self.plan, self.address, self.seed + 1_000 * index)
        drive.start_pump(self.environment.events.request.fire)
        return drive

    def _on_setup(self, environment: Any, msg: Any, **_: Any) -> None:
        self.scenario = with_model_facts(with_inputs(self.file_scenario,
                                                     msg.data.get("filled") or {}),
                                         msg.data.get("unbatched", []),
                                         decoupled=msg.data.get("decoupled", []))
        self.plan = build_plan(self.scenario)
        differs = first_difference(fingerprint(self.scenario, self.plan),
                                   msg.data["fingerprint"])
        if differs is not None:
            reason = (
                f"this worker's scenario differs from the master's at '{differs}' (different "
                "file or version); start every worker with the master's scenario file"
            )
            log.error(reason)
            environment.runner.send_message(REFUSED, {"reason": reason})
            environment.runner.quit()
            return
        index, size = msg.data.get("id_slice") or (0, 0)
        if size:
            sliced = slice_ids(self.scenario, index, size)
            if isinstance(sliced, str):
                log.error(sliced)
                environment.runner.send_message(REFUSED, {"reason": sliced})
                environment.runner.quit()
                return
            self.scenario = sliced
        if self.drive is None or msg.data["address"] != self.address:
            self.address = msg.data["address"]
            self.drive = self._new_drive()

    def _on_open(self, environment: Any, msg: Any, **_: Any) -> None:
        d = msg.data
        if self.drive is None or self.plan is None:
            return
        step = self.plan.phases[d["phase"]].steps[d["step"]]
        arrivals = Arrivals(**d["arrivals"]) if d["arrivals"] else None
        self.seq = d["seq"]
        self.drive.begin(step, d["record"], arrivals)

    def _on_close(self, environment: Any, msg: Any, **_: Any) -> None:
        seq = msg.data["seq"]
        if self.drive is None:
            return
        got = self.drive.end(self.scenario.target.timeout_s + 1)
        reply: dict[str, Any] = {"seq": seq, "drained": True, "cpu_s": 0.0, "rss_bytes": 0,
                                 "in_flight": 0, "window": None, "requests": 0}
        if got is not None:
            reply.update(drained=got.drained, cpu_s=got.cpu_s, rss_bytes=got.rss_bytes,
                         in_flight=got.in_flight, window=got.window.to_wire(),
                         requests=got.window.successes() + got.window.error_count())
        environment.runner.send_message(CLOSED, reply)

    def _on_end_sequences(self, environment: Any, msg: Any, **_: Any) -> None:
        ended = 0
        if self.drive is not None:
            ended = self.drive.end_sequences(self.scenario.target.timeout_s + 1,
                                             bool(msg.data["every"]))
        environment.runner.send_message(ENDED_SEQ, {"seq": msg.data["seq"], "ended": ended})

    def _on_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        window = self.drive.live_window() if self.drive is not None else None
        if window is None:
            return
        # a copy made on the engine thread (LocalDrive.live_window): safe to encode here
        data["loadkit"] = {"seq": self.seq, "window": window.to_wire()}

    def _on_test_stop(self, **_: Any) -> None:
        """A stopped run (or a new one from the web UI) starts from a fresh engine."""
        if self.drive is not None:
            self.drive.stop()
            self.drive = self._new_drive()

    def stop(self) -> None:
        if self.drive is not None:
            self.drive.stop()
