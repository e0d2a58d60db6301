"""`loadkit tune`'s pure parts: the grid order, the strategies, scoring, the Pareto front and
the config.pbtxt the winner is written as."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from loadkit.modelconfig import check_overlay, from_pbtxt, path_overlay, set_path, to_pbtxt
from loadkit.scenario import ConcurrencyLoad, Dimension, Objective, Threshold, TuneSpec
from loadkit.search import space
from loadkit.search.score import operating_point, pareto, reference_of
from loadkit.search.strategies import STRATEGIES

pytestmark = pytest.mark.fast


def test_gray_order_visits_every_point_changing_one_dimension_at_a_time() -> None:
    radix = (2, 3, 4)
    pts = list(space.gray_order(radix))
    assert sorted(pts) == sorted(itertools.product(*(range(r) for r in radix)))
    assert all(sum(a != b for a, b in zip(p, q, strict=True)) == 1
               for p, q in zip(pts, pts[1:], strict=False))


def _run(name: str, radix: tuple[int, ...], f: Any, limit: int = 1000) -> tuple[int, float]:
    s = STRATEGIES[name](radix, seed=3)
    n, best = 0, float("-inf")
    while n < limit and (p := s.propose()) is not None:
        assert p not in s.told, f"{name} proposed {p} twice"
        n += 1
        s.tell(p, {"trial": n, "point": {"score": f(p), "constraints_met": True}})
        best = max(best, f(p))
    return n, best


def test_quick_climbs_to_the_top_of_a_single_peak_in_fewer_trials_than_brute() -> None:
    radix = (3, 4, 4)

    def f(p: tuple[int, ...]) -> float:
        return -((p[0] - 2) ** 2 + (p[1] - 1) ** 2 + (p[2] - 3) ** 2)

    n_brute, best_brute = _run("brute", radix, f)
    n_quick, best_quick = _run("quick", radix, f)
    assert n_brute == 48 and best_brute == 0
    assert best_quick == 0 and n_quick < 15


def test_bayes_is_seeded_and_never_repeats_a_point() -> None:
    radix = (3, 3)
    runs = []
    for _ in range(2):
        s = STRATEGIES["bayes"](radix, seed=7)
        seen = []
        while (p := s.propose()) is not None:
            seen.append(p)
            s.tell(p, {"point": {"score": float(sum(p)), "constraints_met": True}})
        runs.append(seen)
    assert runs[0] == runs[1] and len(set(runs[0])) == 9


def test_a_refused_config_is_never_climbed_to() -> None:
    s = STRATEGIES["quick"]((3,), seed=0)
    assert s.propose() == (0,)
    s.tell((0,), {"point": {"score": 1.0, "constraints_met": True}})
    assert s.propose() == (1,)
    s.tell((1,), None)  # refused by the server
    assert s.propose() is None


def _step(index: int, conc: int, thr: float, p99_ms: float, ok: bool = True) -> dict[str, Any]:
    return {"index": index, "load": {"concurrency": conc}, "status": "ok", "requests": 100,
            "throughput": thr, "errors": {}, "latency_us": {"p50": p99_ms * 500,
                                                            "p99": p99_ms * 1000},
            "client": {}, "server": {"m": {"avg_batch": 2.0, "queue_us": 10.0,
                                           "compute_infer_us": 100.0}},
            "accounting": {"status": "ok" if ok else "mismatch"}}


def _spec(objective: Objective, limit_ms: float = 20.0) -> TuneSpec:
    dims = (Dimension(model="m", path="max_batch_size", values=(8, 16)),)
    return TuneSpec(dimensions=dims, load=ConcurrencyLoad(levels=(1,), step_duration_s=1.0,
                                                          warmup_s=0.0, spec="1"),
                    objective=objective,
                    constraints=(Threshold(metric="p99", limit=limit_ms * 1000),))


def test_the_operating_point_is_the_best_step_within_the_constraints() -> None:
    steps = [_step(0, 2, 100, 5), _step(1, 4, 180, 15), _step(2, 8, 250, 40),
             _step(3, 16, 400, 10, ok=False)]  # numbers that do not add up stand for nothing
    p = operating_point(_spec(Objective("maximize", "throughput")), steps, None)
    assert p is not None and p["step"] == 1 and p["constraints_met"]
    assert p["objective"] == 180
    p = operating_point(_spec(Objective("maximize", "throughput"), limit_ms=1), steps, None)
    assert p is not None and p["step"] == 2 and not p["constraints_met"] and p["broken"]
    p = operating_point(_spec(Objective("minimize", "p99")), steps, None)
    assert p is not None and p["step"] == 0 and p["objective"] == 5000


def test_weighted_gains_are_measured_against_the_baseline() -> None:
    spec = _spec(Objective("weighted", weights=(("throughput", 1.0), ("p99", 1.0))))
    base = [_step(0, 2, 100, 10)]
    ref = reference_of(spec, base)
    assert ref == {"throughput": 100, "p99": 10000}
    p = operating_point(spec, [_step(0, 2, 200, 5)], ref)
    assert p is not None and p["score"] == pytest.approx(2.0)  # (2x + 2x) / 2


def test_pareto_front() -> None:
    def t(n: int, thr: float, p99: float) -> dict[str, Any]:
        return {"trial": n, "point": {"throughput": thr, "p99_us": p99}}

    trials = [t(0, 100, 10), t(1, 200, 20), t(2, 150, 30), t(3, 200, 15), {"trial": 4}]
    assert pareto(trials) == [0, 3]


def test_field_paths_become_overlays_checked_by_the_schema() -> None:
    assert path_overlay("instance_group.count", 2) == {"instance_group": [{"count": 2}]}
    assert check_overlay(path_overlay("instance_group.count", 2)) == []
    assert check_overlay(path_overlay("dynamic_batching.max_queue_delay_us", 1))
    config = {"max_batch_size": 8, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    set_path(config, "instance_group.count", 4)
    set_path(config, "dynamic_batching.preferred_batch_size", [4, 8])
    assert config["instance_group"] == [{"count": 4, "kind": "KIND_CPU"}]
    assert config["dynamic_batching"] == {"preferred_batch_size": [4, 8]}


def test_overlays_keep_the_rest_of_a_touched_field() -> None:
    dims = (Dimension(model="m", path="instance_group.count", values=(1, 2)),
            Dimension(model="m", path="dynamic_batching.max_queue_delay_microseconds",
                      values=(0, 500)))
    original = {"instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}],
                "dynamic_batching": {"preferred_batch_size": [4]}}
    out = space.overlays(dims, (1, 1), {"m": original})
    assert out == {"m": {"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}],
                         "dynamic_batching": {"preferred_batch_size": [4],
                                              "max_queue_delay_microseconds": 500}}}


def test_config_pbtxt_round_trips_through_the_protobuf() -> None:
    config = {"name": "dense", "backend": "python", "max_batch_size": 32,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["256"]}],
              "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
              "dynamic_batching": {"max_queue_delay_microseconds": "500",
                                   "preferred_batch_size": [4, 8]},
              "parameters": {"device_us": {"string_value": "400"}}}
    text = to_pbtxt(config)
    assert 'backend: "python"' in text and "max_queue_delay_microseconds: 500" in text
    back = from_pbtxt(text)
    assert back["instance_group"][0]["count"] == 2
    assert back["dynamic_batching"]["preferred_batch_size"] == [4, 8]


def test_a_gpu_memory_constraint_is_checked_where_reported_and_skipped_where_not() -> None:
    import dataclasses

    from loadkit.search.score import judge

    spec = dataclasses.replace(_spec(Objective("maximize", "throughput")),
                               gpu_memory_bytes=8 << 30)
    step = _step(0, 2, 100, 5)
    ok, broken, skipped, _ = judge(spec, step)
    assert ok and skipped == "gpu_memory: skipped, the server's metrics report no GPU"
    step["metrics"] = {"gauges": {"nv_gpu_memory_used_bytes/GPU-a": 6 << 30,
                                  "nv_gpu_memory_used_bytes/GPU-b": 3 << 30}}
    ok, broken, skipped, _ = judge(spec, step)
    assert not ok and broken == ["gpu_memory 9216 MiB"] and not skipped


def _trial(n: int, objective: float, half: float, count: int = 1, delay: int = 0,
           met: bool = True, uncertain: tuple[str, ...] = ()) -> dict:
    return {"trial": n, "phase": f"trial-{n}",
            "overlay": {"dense": {"instance_group": [{"count": count}],
                                  "dynamic_batching": {"max_queue_delay_microseconds": delay}}},
            "point": {"objective": objective, "score": objective, "constraints_met": met,
                      "broken": [], "uncertain": list(uncertain),
                      "objective_ci": [objective - half, objective + half]}}


def test_racing_picks_the_overlapping_and_the_uncertain_and_recommends_the_cheapest() -> None:
    from loadkit.search import race

    leader = _trial(1, 1000, 50, count=2)
    close = _trial(2, 960, 40, count=1)  # overlaps the leader
    far = _trial(3, 700, 30)  # clearly worse
    unsure = _trial(4, 990, 30, met=True, uncertain=("p99 210 ms (within noise)",))
    trials = [leader, close, far, unsure]
    assert [t["trial"] for t in race.contenders(trials, leader)] == [4, 2]  # RACE_MAX 2
    # racing never measures more often than the search did: at most twice its time
    assert [race.field_size(n) for n in (3, 5, 6, 7, 13, 40)] == [1, 2, 2, 3, 3, 3]
    for n in range(1, 60):
        size = race.field_size(n)
        assert size * race.RACE_ROUNDS <= max(0, n - 1) and size <= race.RACE_MAX + 1
    # 960±40 and 990±30 against 1000±50: not told apart, nor known to be within ±5%
    tied = race.ties(trials, leader)
    assert tied == {2: "inconclusive", 4: "inconclusive"}
    rec = race.recommend(trials, leader, tied)  # cheaper, but maybe worse: not recommended
    assert rec["trial"] == 1 and "2, 4 would be cheaper but are inconclusive" in rec["why"]
    assert race.recommend([leader, far], leader, {})["why"].startswith("the best, beyond noise")
    # measured tightly, a cheaper config within ±5% of the best is the `same`: recommended
    tight, twin = _trial(1, 1000, 5, count=2), _trial(5, 990, 5, count=1)
    assert race.ties([tight, twin], tight) == {5: "same"}
    rec = race.recommend([tight, twin], tight, {5: "same"})
    assert rec["trial"] == 5 and "the same as the best" in rec["why"]
    # a trial measured three times stands for the mean, with t over the three; a constraint
    # broken in one of three measurements is noise, in two of three it is not
    pts = [dict(close["point"], objective=v, score=v, constraints_met=m)
           for v, m in ((960, True), (1000, False), (980, True))]
    combined = race.combine(pts, 0.95)
    assert combined["objective"] == 980 and combined["measurements"] == 3
    assert combined["constraints_met"] and combined["objective_ci"][0] < 960
    assert not race.combine([dict(p, constraints_met=False) for p in pts[:2]] + [pts[2]],
                            0.95)["constraints_met"]
