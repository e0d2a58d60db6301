"""The local drive: this process's engine sends the load (run/drive.py's Drive protocol).

It holds what the Locust users of a process share: templates, mix, gate, and the engine. The
gate is how the conductor makes step boundaries exact: it closes the gate, waits until no
request is in flight, snapshots the server's counters, then opens the next window. Requests are
attributed to the window that was open when they were *sent*. The window is handed over on the
engine thread (Engine.on_loop), the only thread that writes it.
"""

from __future__ import annotations

import bisect
import collections
import functools
import os
import random
import resource
import time
from collections.abc import Callable
from typing import Any

import gevent

from loadkit.control.http_client import connect
from loadkit.control.shared_memory import DEFAULT_OUTPUT_BYTES, SystemMemory, check_local
from loadkit.engine.core import Engine
from loadkit.engine.host import Host
from loadkit.engine.slots import Completion, Lane
from loadkit.engine.streaming import Read, StreamPolicy
from loadkit.loads.registry import runner_for
from loadkit.loads.sequence import end_dangling, new_ids
from loadkit.plan import Arrivals, Plan, Step
from loadkit.record import Recorder, StepWindow
from loadkit.run.drive import Collected
from loadkit.scenario import Scenario
from loadkit.scenario.llm import load_tokenizer
from loadkit.transport.doors import encoder_for
from loadkit.transport.payloads import expected_pool, prepare_pool

DRAIN_POLL_S = 0.002
PUMP_S = 0.2


def cumulative(names: list[str], mix: dict[str, float]) -> list[float]:
    """Cumulative shares of the templates (in `names` order) for a weighted draw."""
    total = sum(mix.values())
    acc, out = 0.0, []
    for n in names:
        acc += mix.get(n, 0.0) / total
        out.append(acc)
    return out


def process_usage() -> tuple[float, int]:
    """(user + sys CPU seconds, current RSS bytes) of this process: what the generator costs."""
    t = os.times()
    rss = 0
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return t.user + t.system, rss


def pump(completions: collections.deque[Completion], fire: Callable[..., Any],
         limit: int = 100_000) -> int:
    """Hand the engine's finished requests to Locust's request event (main thread)."""
    n = 0
    while completions and n < limit:
        c = completions.popleft()
        n += 1
        fire(request_type="grpc", name=c.template, response_time=c.latency_us / 1000.0,
             response_length=c.size, exception=c.error, context=None)
    return n


class LocalDrive:
    def __init__(self, scenario: Scenario, plan: Plan, address: str, seed: int = 0):
        self.scenario = scenario
        self.plan = plan
        self.address = address
        self.seed = seed
        self.recorder = Recorder()
        names = list(scenario.requests)  # a phase's mix may use any of them
        self.template_names = names
        encoder = encoder_for(address, scenario.target)
        self.memory = self._shared_memory(scenario, address)
        place = self.memory.place if self.memory is not None else None
        self.payloads = [prepare_pool(scenario.requests[n], encoder, place) for n in names]
        # per phase: the cumulative weights pick() draws from (switched at each gate opening)
        self.mixes = [cumulative(names, p.mix) for p in plan.phases]
        self.cumulative = cumulative(names, scenario.mix)
        self.think_time_s = scenario.think_time_s
        self._user_seq = 0
        self._fire: Callable[..., Any] | None = None
        self._pump: gevent.Greenlet | None = None
        self._usage0 = (0.0, 0)
        templates = [scenario.requests[n] for n in names]
        g = scenario.goodput
        streams = StreamPolicy(
            list(names),
            streaming=[Read.TO_END if t.decoupled or t.endpoint == "generate_stream"
                       else Read.PLAIN for t in templates],
            cancel=[t.cancel for t in templates],
            tokenizers=[load_tokenizer(t.llm.tokenizer) if t.llm and t.llm.tokenizer
                        else None for t in templates],
            goodput=None if g is None else (int(min(g.first_response_us, 2**62)),
                                            int(min(g.inter_response_us, 2**62)),
                                            int(min(g.latency_us, 2**62))))
        self.engine = Engine(
            address=address, target=scenario.target, pools=self.payloads, names=names,
            pick=self.pick, recorder=self.recorder, think_time_s=scenario.think_time_s,
            method=scenario.target.transport,
            precise_timers=any(step.arrivals is not None for step in plan.steps),
            streams=streams, random_order=[t.order == "random" for t in templates])
        self.host = Host(self.engine)  # what the load models see of it
        self.engine.requests.expect([expected_pool(scenario.requests[n]) for n in names])
        if self.memory is not None:
            memory = self.memory
            self.engine.requests.shm_read = lambda i, entry, want: memory.read(
                names[i], entry, want)
        self.engine.requests.set_sequences([
            t.dataset.sequences if t.sequence is not None and t.dataset is not None else ()
            for t in templates])
        specs = [scenario.requests[n].sequence for n in names]
        self._specs = specs if any(specs) else None
        self._ids = new_ids(specs) if any(specs) else None
        self._phase = -1

    @staticmethod
    def _shared_memory(scenario: Scenario, address: str) -> SystemMemory | None:
        """`shared_memory: system`: this process's regions, registered over the run's door."""
        if scenario.target.shared_memory != "system":
            return None
        check_local(address)
        control = connect(address, scenario.target)
        return SystemMemory(control, scenario.target.output_shm_bytes or DEFAULT_OUTPUT_BYTES)

    def user_rng(self) -> random.Random:
        self._user_seq += 1
        return random.Random(self.seed * 1_000_003 + self._user_seq)

    def pick(self, rng: random.Random) -> int:
        i = bisect.bisect_right(self.cumulative, rng.random())  # a 0 weight is never drawn
        return min(i, len(self.cumulative) - 1)

    @property
    def inflight(self) -> int:
        return self.engine.inflight

    def open_lane(self) -> Lane:
        """Called from a Locust user's on_start: after any fork, so channels are never shared."""
        return self.engine.add_lane(self.user_rng())

    def close_lane(self, lane: Lane) -> None:
        self.engine.remove_lane(lane)

    def close_gate(self, timeout_s: float) -> bool:
        """Stop new requests and wait (cooperatively) for those in flight; False on timeout."""
        self.engine.close_gate()
        deadline = time.monotonic() + timeout_s
        while not self.engine.drained.is_set():
            if time.monotonic() >= deadline:
                return False
            gevent.sleep(DRAIN_POLL_S)
        return True

    def open_gate(self) -> None:
        self.engine.open_gate()

    # ---- the conductor's side: the same three calls locally and on a Locust master ---------
    def users_for(self, step: Step) -> int:
        return step.concurrency

    def missing_senders(self) -> str:
        """Why no load could be sent ('' always: this process sends it itself)."""
        return ""

    def begin(self, step: Step, record: bool, arrivals: Arrivals | None = None) -> None:
        """Open the gate for a warm-up (record=False) or a measured window."""
        a = arrivals if arrivals is not None else step.arrivals
        if step.phase_index < len(self.mixes):
            self.cumulative = self.mixes[step.phase_index]
        if step.phase_index != self._phase:
            self._phase = step.phase_index
            self.engine.epoch += 1
        runner = runner_for(a, self._specs, self._ids)  # the load model (loads/registry.py)
        self.engine.set_runner(functools.partial(runner, self.host))
        if record:
            self._usage0 = process_usage()
            self.recorder.open(step)
        self.open_gate()

    def end_sequences(self, timeout_s: float, every: bool) -> int:
        """(Gate closed.) Send the END of every sequence the server may still hold for this
        process (with `every`, the lanes' open ones too: a phase or the run ends) and wait
        for the answers, outside any window. The number of ENDs sent."""
        ids = self._ids
        if ids is None or self.engine.loop is None:
            return 0
        sent = self.engine.on_loop(lambda: end_dangling(self.host, ids, every)) or 0
        deadline = time.monotonic() + timeout_s
        while sent and not self.engine.drained.is_set() and time.monotonic() < deadline:
            gevent.sleep(DRAIN_POLL_S)
        return sent

    def end(self, timeout_s: float) -> Collected | None:
        """Close the gate, wait for what is in flight, hand over the window (None after a
        warm-up)."""
        drained = self.close_gate(timeout_s)
        cpu, rss = process_usage()
        self.pump()
        window = self.engine.on_loop(lambda: self._take_window(drained))
        if window is None:  # nothing open, or the engine is gone (then nothing writes it)
            window = self.recorder.close()
        if window is None:
            return None
        return Collected(window=window, drained=drained, cpu_s=cpu - self._usage0[0],
                         rss_bytes=rss, in_flight=self.inflight)

    def _take_window(self, drained: bool) -> StepWindow | None:
        """(Engine thread.) Close the window; if requests are still in flight (the drain timed
        out) they would go on writing into it, so the caller gets a copy."""
        window = self.recorder.close()
        return window if window is None or drained else window.copy()

    def live_window(self) -> StepWindow | None:
        return self.engine.live_copy()

    def in_flight(self) -> int | None:
        return self.inflight  # an int read from another thread: a sample, not a lock

    def attach(self, environment: Any) -> None:
        self.start_pump(environment.events.request.fire)

    def start_pump(self, fire: Callable[..., Any]) -> None:
        """Feed finished requests to Locust's request event from the main thread, in batches."""
        if self._pump is None:
            self._fire = fire
            self._pump = gevent.spawn(self._pump_loop)

    def pump(self) -> None:
        if self._fire is not None:
            pump(self.engine.completions, self._fire)

    def _pump_loop(self) -> None:
        while True:
            self.pump()
            gevent.sleep(PUMP_S)

    def stop(self) -> None:
        """At the end of the run: stop the engine, hand Locust the last completions, remove
        the shared memory regions."""
        self.engine.stop()
        if self.memory is not None:
            self.memory.close()
            self.memory.control.close()
            self.memory = None
        self.pump()
        if self._pump is not None:
            self._pump.kill(block=False)
            self._pump = None
