"""A template's `sequence:` key: a stateful model's sequences (loads/sequence.py runs them)."""

from __future__ import annotations

from typing import Any

from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import SequenceSpec
from loadkit.scenario.source import KeyPath


def sequence_spec(ck: Checker, raw: Any, path: KeyPath,
              from_data: tuple[int, ...] = ()) -> SequenceSpec | None:
    """`sequence: {length: 20, length_variation: 25, ids: [1, 1000], id_type: string}`; with a
    data set in perf_analyzer's sequence form (`from_data`: its sequences' lengths) the data
    set gives each sequence's length, and `length` is not written."""
    m = ck.mapping(raw, path, ("length", "length_variation", "ids", "id_type"),
                   () if from_data else ("length",))
    if m is None or ("length" not in m and not from_data):
        return None
    if from_data:
        for key in ("length", "length_variation"):
            if key in m:
                ck.add((*path, key), f"the data set's {len(from_data)} sequences give each "
                                     f"sequence's length ({min(from_data)}..{max(from_data)} "
                                     f"steps); expected no '{key}'")
    length = (ck.integer(m["length"], (*path, "length"), 1, 1_000_000) if "length" in m
              else max(from_data))
    variation = 0.0
    if "length_variation" in m:
        variation = ck.number(m["length_variation"], (*path, "length_variation"), 0, False) or 0
        if variation > 100:
            ck.add((*path, "length_variation"), f"expected a percentage from 0 to 100; found "
                                                f"{m['length_variation']}")
    ids = (1, 2**31 - 1)
    if "ids" in m:
        r = m["ids"]
        ok = (isinstance(r, list) and len(r) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in r) and r[0] <= r[1])
        if not ok:
            ck.add((*path, "ids"), f"expected [first, last] correlation ids, 1 <= first <= last; "
                                   f"found {found(r)}")
        else:
            ids = (r[0], r[1])
    id_type = ck.choice(m, "id_type", path, ("uint64", "string"), "uint64")
    return None if length is None else SequenceSpec(length=length, variation=variation, ids=ids,
                                                    id_type=id_type)
