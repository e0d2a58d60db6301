"""`--prometheus-port`: loadkit's own metrics, live, for the dashboards a platform team already
has (Prometheus + Grafana, beside Triton's nv_inference_* and nv_gpu_* series).

Counts are those of the measured windows, the numbers results.json will hold: the finished
steps plus the window being measured (warm-ups are not counted). A greenlet on the run's hub
refreshes one snapshot a second, the metric families built then; the HTTP server
(prometheus_client, its own thread) only yields what the last refresh built, so a scrape
neither touches the engine nor walks a histogram. Config reloads run off the hub
(run/conductor.py), so the counts go on through them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import gevent
from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from loadkit.errors import ExporterError
from loadkit.record import StepWindow, decode, new_histogram

log = logging.getLogger("loadkit.exporter")
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0)
QUANTILES = (0.5, 0.9, 0.99, 0.999)
REFRESH_S = 1.0
STEP_CHECK_S = 0.1


class Totals:
    """Successes, errors, dropped and late per template, and latency histograms, summed."""

    def __init__(self) -> None:
        self.ok: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.dropped: Counter[str] = Counter()
        self.late: Counter[str] = Counter()
        self.hists: dict[str, HdrHistogram] = {}

    def add_window(self, window: StepWindow) -> None:
        for name, h in window.histograms.items():
            self.ok[name] += h.get_total_count()
            self._hist(name).add(h)
        self._counts(window)

    def add_step(self, step: Any) -> None:
        """A finished step, from its result (histograms encoded as in histograms.json)."""
        for name, text in step.histograms.items():
            h = decode(text)
            self.ok[name] += h.get_total_count()
            self._hist(name).add(h)
        for name, c in step.client.items():
            for code, n in c.get("errors_by_code", {}).items():
                self.errors[(name, code)] += n
            self.dropped[name] += c.get("dropped", 0)
            self.late[name] += c.get("late", 0)

    def _counts(self, window: StepWindow) -> None:
        for name, codes in window.errors.items():
            for code, n in codes.items():
                self.errors[(name, code)] += n
        self.dropped.update(window.dropped)
        self.late.update(window.late)

    def _hist(self, name: str) -> HdrHistogram:
        if name not in self.hists:
            self.hists[name] = new_histogram()
        return self.hists[name]

    def plus(self, window: StepWindow | None) -> Totals:
        out = Totals()
        out.ok.update(self.ok)
        out.errors.update(self.errors)
        out.dropped.update(self.dropped)
        out.late.update(self.late)
        for name, h in self.hists.items():
            out._hist(name).add(h)
        if window is not None:
            out.add_window(window)
        return out


def _buckets(h: HdrHistogram) -> list[tuple[str, float]]:
    """Cumulative counts at each bucket bound (seconds), as a Prometheus histogram has them."""
    counts = [0] * len(BUCKETS_S)
    for item in h.get_recorded_iterator():
        v_s = item.value_iterated_to / 1e6
        for i, bound in enumerate(BUCKETS_S):
            if v_s <= bound:
                counts[i] += item.count_at_value_iterated_to
                break
    out, total = [], 0
    for bound, n in zip(BUCKETS_S, counts, strict=True):
        total += n
        out.append((repr(bound), total))
    out.append(("+Inf", h.get_total_count()))
    return out


class Exporter:
    """The live metrics of one run; `start` serves them, `stop` closes the port."""

    def __init__(self, run: Any):
        self.run = run
        self.done = Totals()  # finished steps
        self.counted = 0  # how many finished steps `done` holds
        self.snapshot: dict[str, Any] = {"totals": Totals(), "live": None, "status": {}}
        self.families: list[Metric] = []  # what a scrape returns, built by refresh
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]
        self.server: Any = None
        self.thread: Any = None
        self.greenlet: gevent.Greenlet | None = None

    def start(self, host: str, port: int) -> None:
        try:
            self.server, self.thread = start_http_server(port, addr=host,
                                                         registry=self.registry)
        except OSError as exc:
            raise ExporterError(f"--prometheus-port {port}: cannot listen on {host}:{port}: "
                                f"{exc}") from None
        self.refresh()
        self.greenlet = gevent.spawn(self._loop)

    def stop(self) -> None:
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
        self.refresh()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _loop(self) -> None:
        """Refresh every second, and as soon as a step finishes (so the finished numbers are
        served before the run winds up and closes the port)."""
        last = 0.0
        while True:
            gevent.sleep(STEP_CHECK_S)
            finished = sum(len(p.steps) for p in self.run.result.phases)
            now = time.monotonic()
            if finished == self.counted and now - last < REFRESH_S:
                continue
            last = now
            try:
                self.refresh()
            except Exception:  # a bad refresh must not end the run; the next one may work
                log.exception("refreshing the live metrics failed")

    def refresh(self) -> None:
        """Fold finished steps into the totals and take the live window (on the hub)."""
        steps = [s for p in self.run.result.phases for s in p.steps]
        for step in steps[self.counted:]:
            self.done.add_step(step)
        self.counted = len(steps)
        live = self.run.drive.live_window() if self.run.conductor.stage == "measuring" else None
        status = self.run.conductor.status()
        self.snapshot = {"totals": self.done.plus(live), "live": live, "status": status,
                         "in_flight": self.run.drive.in_flight()}
        self.families = list(self._build())

    def collect(self) -> Iterator[Metric]:
        yield from self.families
        yield from self._now()

    def _now(self) -> Iterator[Metric]:
        """What the run is doing at the moment of the scrape, read from the conductor's plain
        attributes (no engine call): a step's annotation region starts and ends on time even
        while the hub is busy writing a report."""
        conductor = self.run.conductor
        stage, current, phase = conductor.stage, conductor.current, conductor.phase
        step = GaugeMetricFamily("loadkit_step_info", "The phase and step being warmed up or "
                                 "measured (value 1; absent between steps, so an annotation "
                                 "region is one step)", labels=["phase", "step", "load", "stage"])
        if current is not None and stage in ("warm-up", "measuring"):
            step.add_metric([current.phase, str(current.index + 1), current.label, stage], 1)
        yield step
        swap = GaugeMetricFamily("loadkit_config_swap_info", "A phase's config being loaded "
                                 "(value 1 while it lasts)", labels=["phase"])
        if stage == "configuring" and phase is not None:
            swap.add_metric([phase.name], 1)
        yield swap

    def _build(self) -> Iterator[Metric]:
        snap = self.snapshot
        totals: Totals = snap["totals"]
        requests = CounterMetricFamily("loadkit_requests", "Successful requests in measured "
                                       "windows, per request template and its model (beside "
                                       "Triton's nv_inference_request_success per model)",
                                       labels=["template", "model"])
        models = {n: t.model for n, t in self.run.scenario.requests.items()}
        for name, n in sorted(totals.ok.items()):
            requests.add_metric([name, models.get(name, "")], n)
        yield requests
        errors = CounterMetricFamily("loadkit_errors", "Failed requests in measured windows, "
                                     "per template and gRPC status code",
                                     labels=["template", "code"])
        for (name, code), n in sorted(totals.errors.items()):
            errors.add_metric([name, code], n)
        yield errors
        dropped = CounterMetricFamily("loadkit_dropped", "Open loop: scheduled sends dropped "
                                      "(max_concurrency in flight)", labels=["template"])
        late = CounterMetricFamily("loadkit_late", "Open loop: sends later than "
                                   "late_tolerance", labels=["template"])
        for name in sorted(models):  # every template from the start: a 0 is a reading too
            dropped.add_metric([name], totals.dropped.get(name, 0))
            late.add_metric([name], totals.late.get(name, 0))
        yield dropped
        yield late
        latency = HistogramMetricFamily("loadkit_latency_seconds", "Latency of successful "
                                        "requests in measured windows (from HDR histograms)",
                                        labels=["template"])
        for name, h in sorted(totals.hists.items()):
            latency.add_metric([name], _buckets(h),
                               sum_value=h.get_mean_value() * h.get_total_count() / 1e6)
        yield latency
        # the run's measured windows so far, from the HDR histograms themselves: the p99 the
        # report will print (a quantile interpolated between the buckets above reads up to 2x)
        run_q = GaugeMetricFamily("loadkit_latency_quantile_seconds", "HDR quantiles of every "
                                  "measured window so far (the report's numbers)",
                                  labels=["template", "quantile"])
        for name, h in sorted(totals.hists.items()):
            if h.get_total_count():
                for q in QUANTILES:
                    run_q.add_metric([name, str(q)], h.get_value_at_percentile(q * 100) / 1e6)
        yield run_q
        quantiles = GaugeMetricFamily("loadkit_step_latency_seconds", "HDR quantiles of the "
                                      "step being measured", labels=["template", "quantile"])
        live: StepWindow | None = snap["live"]
        if live is not None:
            for name, h in sorted(live.histograms.items()):
                if h.get_total_count():
                    for q in QUANTILES:
                        quantiles.add_metric([name, str(q)],
                                             h.get_value_at_percentile(q * 100) / 1e6)
        yield quantiles
        flight = GaugeMetricFamily("loadkit_in_flight", "Requests in flight in this process")
        if snap.get("in_flight") is not None:
            flight.add_metric([], snap["in_flight"])
        yield flight
