"""HDR recording: integer microseconds, ordered percentiles, lossless encode/decode,
no silent drops."""

from __future__ import annotations

import random

import pytest

from loadkit.plan import Step
from loadkit.record import (
    HIGHEST_US,
    StepWindow,
    decode,
    encode,
    latency_summary,
    new_histogram,
    record_value,
)

pytestmark = pytest.mark.fast


def step() -> Step:
    return Step(phase_index=0, phase="p", index=0, concurrency=1, warmup_s=0.0, duration_s=1.0)


def test_percentiles_are_microseconds_with_3_digits() -> None:
    w = StepWindow(step=step())
    for v in range(1, 10_001):  # 1 us .. 10 ms
        w.record("a", v)
    s = latency_summary(w.merged())
    assert s["p50"] == 5003.0  # 3 significant digits: within 0.1 % of 5000
    assert abs(s["p99"] - 9900) <= 10
    assert s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["p999"] <= s["max"]


def test_encode_decode_round_trip_and_merge() -> None:
    w = StepWindow(step=step())
    for v in (120, 250, 999, 1500, 40_000):
        w.record("a", v)
        w.record("b", v * 2)
    decoded = {k: decode(v) for k, v in w.encoded().items()}
    merged = new_histogram()
    for h in decoded.values():
        merged.add(h)
    assert merged.get_total_count() == 10
    assert latency_summary(merged) == latency_summary(w.merged())


def test_out_of_range_values_are_counted_not_dropped_silently() -> None:
    w = StepWindow(step=step())
    w.record("a", HIGHEST_US * 10)
    w.record("a", 0)  # clamps to the lowest trackable value, 1 us
    assert w.out_of_range == 1
    assert w.successes("a") == 1


def test_errors_are_counted_by_code_not_recorded() -> None:
    w = StepWindow(step=step())
    w.error("a", "UNAVAILABLE")
    w.error("a", "UNAVAILABLE")
    w.error("b", "DEADLINE_EXCEEDED")
    assert w.error_count() == 3
    assert w.successes() == 0


def test_inlined_record_value_matches_hdrh_bucket_for_bucket() -> None:
    rng = random.Random(7)
    values = [1, 2, 2047, 2048, 2049, 4095, 4096, HIGHEST_US, HIGHEST_US + 1]
    values += [int(10 ** rng.uniform(0, 9.5)) + 1 for _ in range(20_000)]  # up to ~3e9 us
    ours, theirs = new_histogram(), new_histogram()
    refused = 0
    for v in values:
        ok = theirs.record_value(v)
        assert record_value(ours, v) == ok, v
        refused += not ok
    assert 0 < refused < len(values)  # both sides of the range edge were exercised
    assert list(ours.counts) == list(theirs.counts)
    assert (ours.total_count, ours.min_value, ours.max_value) == (
        theirs.total_count, theirs.min_value, theirs.max_value)
    assert encode(ours) == encode(theirs)
    assert latency_summary(ours) == latency_summary(theirs)


@pytest.mark.fast
def test_every_window_field_crosses_the_wire() -> None:
    """A new StepWindow field must be given a kind in record.WIRE (or a worker's part of it
    would be dropped silently); each kind round-trips through to_wire/add_wire."""
    import dataclasses

    from loadkit.record import WIRE

    fields = {f.name for f in dataclasses.fields(StepWindow)}
    kinds = [name for names in WIRE.values() for name in names]
    assert sorted(kinds) == sorted(fields), set(fields) ^ set(kinds)
    a = StepWindow(step=step())
    a.record("t", 120, 100)
    a.error("t", "UNAVAILABLE", "gone")
    a.streamed("t", 50, [10, 20], 3, 200, None, 7)
    a.streamed("t", 0, [], 0, 90, None)
    a.sequence_done("t", 900)
    a.use("t", 4)
    a.dropped["t"] += 2
    a.cancelled["t"] += 1
    a.sent, a.scheduled, a.own_us = 5, 7, 11
    b = StepWindow(step=step())
    b.add_wire(a.to_wire())
    b.add_wire(a.to_wire())
    for name in WIRE["histograms"]:
        assert {k: h.get_total_count() * 2 for k, h in getattr(a, name).items()} == \
            {k: h.get_total_count() for k, h in getattr(b, name).items()}, name
    for name in WIRE["counters"]:
        assert {k: 2 * v for k, v in getattr(a, name).items()} == dict(getattr(b, name)), name
    for name in WIRE["numbers"]:
        assert getattr(b, name) == 2 * getattr(a, name), name
    assert b.errors == {"t": {"UNAVAILABLE": 2}} and b.payloads == {"t": {4}}
    assert b.messages == {"UNAVAILABLE": {"gone": 2}}
    assert sum(s.ok["t"] for s in b.seconds.values()) == 2
