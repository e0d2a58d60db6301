"""Record: every latency into an HDR histogram, in integer microseconds (1 us .. 60 s, 3 digits).

One histogram per (step, request template), merged per step on demand. Errors are counted by
gRPC status code and never recorded as latencies. Values outside the trackable range are counted,
not silently dropped (hdrh's record_value returns False for them).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from loadkit.plan import Step

LOWEST_US = 1
HIGHEST_US = 60_000_000
SIGNIFICANT_DIGITS = 3
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
# The server's own words for failures, bounded per step: a step where every request fails the
# same way keeps one message and its count, a flood of distinct ones keeps the first few.
MESSAGES_PER_CODE = 5
MESSAGE_CHARS = 300
OTHER_MESSAGES = "(other messages)"


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def _constants() -> tuple[int, int, int, int, int]:
    h = new_histogram()
    return (h.sub_bucket_mask, h.unit_magnitude, h.sub_bucket_half_count_magnitude,
            h.sub_bucket_half_count, h.counts_len)


_MASK, _UNIT, _HALF_MAG, _HALF, _LEN = _constants()


def record_value(h: HdrHistogram, value: int) -> bool:
    """`h.record_value(value)` for a histogram from new_histogram(), with hdrh's index
    arithmetic inlined: one Python call instead of five, several times cheaper per sample on
    the engine thread (docs/performance.md). Same buckets, counts, min and max
    (tests/transport/test_record.py compares them); False, and nothing recorded, above the trackable
    range. `value` is an int >= LOWEST_US."""
    bucket = (value | _MASK).bit_length() - _UNIT - _HALF_MAG - 1
    index = ((bucket + 1) << _HALF_MAG) + (value >> (bucket + _UNIT)) - _HALF
    if index >= _LEN:
        return False
    h.counts[index] += 1
    h.total_count += 1
    if value < h.min_value:
        h.min_value = value
    if value > h.max_value:
        h.max_value = value
    return True


def encode(h: HdrHistogram) -> str:
    """HdrHistogram's standard compressed base64 form, readable by every HDR implementation."""
    return h.encode().decode("ascii")


def decode(text: str) -> HdrHistogram:
    return HdrHistogram.decode(text.encode("ascii"))


def latency_summary(h: HdrHistogram) -> dict[str, float | None]:
    """p50..p999, max and mean in microseconds; None (null in results.json, `-` in every
    table) when nothing was recorded: an empty histogram has no percentile, not 0 µs."""
    if h.get_total_count() == 0:
        return {**{k: None for k in PERCENTILES}, "max": None, "mean": None}
    out: dict[str, float | None] = {k: float(h.get_value_at_percentile(q))
                                    for k, q in PERCENTILES.items()}
    out["max"] = float(h.get_max_value())
    out["mean"] = round(float(h.get_mean_value()), 1)
    return out


@dataclass(kw_only=True)
class Second:
    """One second of a window (by completion time): successes per template, their latencies,
    errors by code, and what was sent, scheduled and dropped meanwhile (the timeline)."""

    hist: HdrHistogram = field(default_factory=new_histogram)
    ok: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    scheduled: int = 0
    dropped: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"h": encode(self.hist), "ok": dict(self.ok), "errors": dict(self.errors),
                "sent": self.sent, "scheduled": self.scheduled, "dropped": self.dropped}

    def add_wire(self, data: dict[str, Any]) -> None:
        self.hist.decode_and_add(data["h"].encode("ascii"))
        self.ok.update(data["ok"])
        self.errors.update(data["errors"])
        self.sent += int(data["sent"])
        self.scheduled += int(data["scheduled"])
        self.dropped += int(data["dropped"])


@dataclass(kw_only=True)
class StepWindow:
    """What one measured step collected on this process."""

    step: Step
    histograms: dict[str, HdrHistogram] = field(default_factory=dict)
    errors: dict[str, Counter[str]] = field(default_factory=dict)
    out_of_range: int = 0
    # open loop only: latency from the actual send (`histograms` count from the scheduled time)
    service: dict[str, HdrHistogram] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    late: Counter[str] = field(default_factory=Counter)
    # open loop only: how late each send left after its scheduled time (µs), per template
    lateness: dict[str, HdrHistogram] = field(default_factory=dict)
    # of the successes' latencies, the µs spent in the generator's own framing (engine/core.py)
    own_us: int = 0
    # per status code: the first distinct messages and how often each came (kept_message)
    messages: dict[str, dict[str, int]] = field(default_factory=dict)
    # requests that left in this window, and (open loop) the sends the schedule asked for: the
    # run checks sent == successes + errors and scheduled == sent + dropped from these
    sent: int = 0
    scheduled: int = 0
    # per template with a pool: which of its prepared requests were sent (indices)
    payloads: dict[str, set[int]] = field(default_factory=dict)
    # per sequence template: sequences that ended in this window, and each one's latency from
    # its first send to its last response
    sequences: dict[str, HdrHistogram] = field(default_factory=dict)
    # per decoupled template (engine/streaming.py): time to the first response, the gaps
    # between consecutive responses, how many responses came, and (with `goodput`) how many
    # requests met every goodput threshold
    first_response: dict[str, HdrHistogram] = field(default_factory=dict)
    inter_response: dict[str, HdrHistogram] = field(default_factory=dict)
    responses: Counter[str] = field(default_factory=Counter)
    good: Counter[str] = field(default_factory=Counter)
    # requests the template's `cancel:` cancelled after their first responses (not errors)
    cancelled: Counter[str] = field(default_factory=Counter)
    output_tokens: Counter[str] = field(default_factory=Counter)  # with a tokenizer only
    # successful streamed requests whose final flag came with no response before it: their
    # latency is recorded, their (absent) first response is not
    no_response: Counter[str] = field(default_factory=Counter)
    # the timeline: one Second per second since the window opened, by completion time; the
    # counts sent/scheduled/dropped had when the current second began
    seconds: dict[int, Second] = field(default_factory=dict)
    opened: float = field(default_factory=time.monotonic)
    _now: int = -1
    _mark: tuple[int, int, int] = (0, 0, 0)

    def second(self) -> Second:
        """The bucket of this moment; moving on settles what the last one sent."""
        i = int(time.monotonic() - self.opened)
        if i != self._now:
            self.settle()  # the second before gets what was sent meanwhile (none: kept for i)
            self._now = i
            if i not in self.seconds:
                self.seconds[i] = Second()
        return self.seconds[i]

    def settle(self) -> None:
        """Give the current second what was sent, scheduled and dropped since it began (sends
        are attributed to the second of the next completion: the totals add up exactly)."""
        sec = self.seconds.get(self._now)
        if sec is not None:
            sent, scheduled, dropped = self._mark
            sec.sent += self.sent - sent
            sec.scheduled += self.scheduled - scheduled
            sec.dropped += sum(self.dropped.values()) - dropped
            self._mark = (self.sent, self.scheduled, sum(self.dropped.values()))

    def streamed(self, template: str, first_us: int, gaps: list[int], responses: int,
                 latency_us: int, goodput: tuple[int, int, int] | None,
                 tokens: int | None = None) -> None:
        """A decoupled model's successful request: its responses' timing. Good (goodput):
        first response, mean gap and latency each within its threshold (µs)."""
        h = self.first_response.get(template)
        if h is None:
            h = self.first_response[template] = new_histogram()
            self.inter_response[template] = new_histogram()
        if not responses:  # only the final flag came: no first response to time
            self.no_response[template] += 1
            return
        if not record_value(h, first_us if first_us > LOWEST_US else LOWEST_US):
            self.out_of_range += 1
        gap_h = self.inter_response[template]
        for gap in gaps:
            if not record_value(gap_h, gap if gap > LOWEST_US else LOWEST_US):
                self.out_of_range += 1
        self.responses[template] += responses
        if tokens is not None:  # counted by the llm template's tokenizer
            self.output_tokens[template] += tokens
        if goodput is not None and responses:
            first_max, gap_max, latency_max = goodput
            mean_gap = sum(gaps) / len(gaps) if gaps else 0
            if first_us <= first_max and mean_gap <= gap_max and latency_us <= latency_max:
                self.good[template] += 1

    def sequence_done(self, template: str, latency_us: int) -> None:
        h = self.sequences.get(template)
        if h is None:
            h = self.sequences[template] = new_histogram()
        if not record_value(h, latency_us if latency_us > LOWEST_US else LOWEST_US):
            self.out_of_range += 1

    def use(self, template: str, index: int) -> None:
        used = self.payloads.get(template)
        if used is None:
            used = self.payloads[template] = set()
        used.add(index)

    def record(self, template: str, latency_us: int, service_us: int | None = None) -> None:
        h = self.histograms.get(template)
        if h is None:
            h = self.histograms[template] = new_histogram()
        value = latency_us if latency_us > LOWEST_US else LOWEST_US
        if not record_value(h, value):
            self.out_of_range += 1
        sec = self.second()
        sec.ok[template] += 1
        record_value(sec.hist, value)
        if service_us is not None:
            s = self.service.get(template)
            if s is None:
                s = self.service[template] = new_histogram()
            record_value(s, service_us if service_us > LOWEST_US else LOWEST_US)

    def sent_late(self, template: str, late_us: int) -> None:
        h = self.lateness.get(template)
        if h is None:
            h = self.lateness[template] = new_histogram()
        record_value(h, late_us if late_us > LOWEST_US else LOWEST_US)

    def merged_lateness(self) -> HdrHistogram:
        total = new_histogram()
        for h in self.lateness.values():
            total.add(h)
        return total

    def merged_service(self) -> HdrHistogram:
        total = new_histogram()
        for h in self.service.values():
            total.add(h)
        return total

    def error(self, template: str, code: str, message: str = "") -> None:
        self.errors.setdefault(template, Counter())[code] += 1
        self.second().errors[code] += 1
        self.keep_message(code, message)

    def keep_message(self, code: str, message: str, count: int = 1) -> None:
        kept = self.messages.get(code)
        if kept is None:
            kept = self.messages[code] = {}
        text = message[:MESSAGE_CHARS] if message else "(no message)"
        if text not in kept and sum(k != OTHER_MESSAGES for k in kept) >= MESSAGES_PER_CODE:
            text = OTHER_MESSAGES
        kept[text] = kept.get(text, 0) + count

    def merged(self) -> HdrHistogram:
        total = new_histogram()
        for h in self.histograms.values():
            total.add(h)
        return total

    def successes(self, template: str | None = None) -> int:
        if template is not None:
            h = self.histograms.get(template)
            return h.get_total_count() if h is not None else 0
        return sum(h.get_total_count() for h in self.histograms.values())

    def error_count(self) -> int:
        return sum(sum(c.values()) for c in self.errors.values())

    def encoded(self) -> dict[str, str]:
        return {name: encode(h) for name, h in self.histograms.items()}

    def encoded_service(self) -> dict[str, str]:
        return {name: encode(h) for name, h in self.service.items()}

    def copy(self) -> StepWindow:
        """A window with the same samples and counts (a live copy, or one handed over while
        requests still write into this one)."""
        twin = StepWindow(step=self.step)
        twin.add_wire(self.to_wire())
        return twin

    def to_wire(self) -> dict[str, Any]:
        """Everything the window holds, as plain data a Locust message can carry: each field
        by its kind (WIRE), so a new field is carried once it is given a kind there."""
        self.settle()
        out: dict[str, Any] = {}
        for name in WIRE["histograms"]:
            out[name] = {k: encode(h) for k, h in getattr(self, name).items()}
        for name in WIRE["counters"]:
            out[name] = dict(getattr(self, name))
        for name in WIRE["numbers"]:
            out[name] = getattr(self, name)
        out["errors"] = {n: dict(c) for n, c in self.errors.items()}
        out["messages"] = {c: dict(m) for c, m in self.messages.items()}
        out["payloads"] = {n: sorted(u) for n, u in self.payloads.items()}
        out["seconds"] = {str(i): sec.to_wire() for i, sec in self.seconds.items()}
        return out

    def add_wire(self, data: dict[str, Any]) -> None:
        """Merge another process's window (from to_wire) into this one, sample for sample."""
        for name in WIRE["histograms"]:
            target = getattr(self, name)
            for key, text in data.get(name, {}).items():
                h = target.get(key)
                if h is None:
                    h = target[key] = new_histogram()
                h.decode_and_add(text.encode("ascii"))
        for name in WIRE["counters"]:
            getattr(self, name).update(data.get(name, {}))
        for name in WIRE["numbers"]:
            setattr(self, name, getattr(self, name) + int(data.get(name, 0)))
        for name, codes in data.get("errors", {}).items():
            self.errors.setdefault(name, Counter()).update(codes)
        for code, kept in data.get("messages", {}).items():
            for text, n in kept.items():
                self.keep_message(code, text, int(n))
        for name, used in data.get("payloads", {}).items():
            self.payloads.setdefault(name, set()).update(used)
        for i, sec in data.get("seconds", {}).items():  # by seconds since each window opened
            mine = self.seconds.get(int(i))
            if mine is None:
                mine = self.seconds[int(i)] = Second()
            mine.add_wire(sec)


# How each StepWindow field crosses from a worker to the master (to_wire / add_wire): by kind,
# merged by kind. tests/transport/test_record.py fails on a field given no kind here, so no worker's
# measurement can be dropped silently.
WIRE: dict[str, tuple[str, ...]] = {
    "histograms": ("histograms", "service", "lateness", "sequences", "first_response",
                   "inter_response"),
    "counters": ("dropped", "late", "responses", "good", "cancelled", "output_tokens",
                 "no_response"),
    "numbers": ("out_of_range", "own_us", "sent", "scheduled"),
    "special": ("errors", "messages", "payloads", "seconds"),
    "local": ("step", "opened", "_now", "_mark"),  # this process's own clock and step
}


class Recorder:
    """Holds the window that requests sent now belong to; None between measured windows."""

    def __init__(self) -> None:
        self.window: StepWindow | None = None

    def open(self, step: Step) -> StepWindow:
        self.window = StepWindow(step=step)
        return self.window

    def close(self) -> StepWindow | None:
        window, self.window = self.window, None
        return window
