"""Recorded traffic read as arrivals (scenario/traffic.py): each format, the window, Triton's
sampling and numbered parts, an ensemble's children left out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write

from loadkit.errors import DatasetError
from loadkit.scenario.traffic import ANY, read_traffic


def _trace(tid: int, model: str, ns: int, parent: int | None = None) -> list[dict]:
    """Triton writes a trace's facts and its timestamps as separate entries of one id."""
    head: dict = {"id": tid, "model_name": model, "model_version": 1}
    if parent is not None:
        head["parent_id"] = parent
    return [head, {"id": tid, "timestamps": [{"name": "REQUEST_START", "ns": ns},
                                             {"name": "REQUEST_END", "ns": ns + 900}]}]


@pytest.mark.fast
def test_intervals_start_at_zero_and_end_after_the_last_gap(tmp_path: Path) -> None:
    t = read_traffic(write(tmp_path / "i.txt", "1000\n2000\n\n3000\n"))
    assert t.format == "intervals" and t.models == (ANY,)
    assert np.allclose(t.offsets, [0.0, 0.001, 0.003]) and t.duration_s == pytest.approx(0.006)


@pytest.mark.fast
def test_a_triton_trace_in_numbered_parts_without_an_ensembles_children(tmp_path: Path) -> None:
    base = 5_000_000_000
    part0 = _trace(1, "pipe", base) + _trace(2, "pre", base + 10, parent=1) + \
        _trace(3, "dense", base + 500_000_000)
    part1 = _trace(4, "pipe", base + 1_000_000_000)
    write(tmp_path / "trace.json.0", json.dumps(part0))
    write(tmp_path / "trace.json.1", json.dumps(part1))
    t = read_traffic(tmp_path / "trace.json")  # the parts, as one
    assert t.format == "triton_trace" and t.in_file == 3  # the child of 1 left out
    assert np.allclose(t.offsets, [0.0, 0.5, 1.0])
    assert [t.models[i] for i in t.model_of] == ["pipe", "dense", "pipe"]


@pytest.mark.fast
def test_a_sampled_trace_stands_for_its_rate_of_requests(tmp_path: Path) -> None:
    entries = [e for k in range(3) for e in _trace(k + 1, "dense", k * 1_000_000_000)]
    t = read_traffic(write(tmp_path / "t.json", json.dumps(entries)), sample_rate=4)
    assert len(t.offsets) == 12 and t.in_file == 3
    assert np.allclose(t.offsets[:5], [0.0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.fast
def test_a_rate_profile_is_poisson_within_each_piece(tmp_path: Path) -> None:
    csv = "t,template,rate\n0,a,100\n10,a,400\n20,a,0\n0,b,50\n20,b,0\n"
    t = read_traffic(write(tmp_path / "p.csv", csv), seed=3)
    assert t.format == "rate_csv" and set(t.models) == {"a", "b"} and t.duration_s == 20
    a = t.offsets[t.model_of == t.models.index("a")]
    first, second = (a < 10).sum(), (a >= 10).sum()
    assert 800 < first < 1200 and 3600 < second < 4400  # 1000 and 4000 expected
    assert np.all(np.diff(t.offsets) >= 0)
    again = read_traffic(tmp_path / "p.csv", seed=3)
    assert np.array_equal(again.offsets, t.offsets)  # seeded


@pytest.mark.fast
def test_a_prometheus_range_query_by_model(tmp_path: Path) -> None:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"model": "dense"}, "values": [[1000, "50"], [1005, "200"], [1010, "0"]]},
    ]}}
    t = read_traffic(write(tmp_path / "q.json", json.dumps(doc)), seed=1)
    assert t.format == "prometheus" and t.models == ("dense",) and t.duration_s == 10
    assert 150 < (t.offsets < 5).sum() < 350 and 800 < (t.offsets >= 5).sum() < 1200


def _prom(result: list) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@pytest.mark.fast
def test_a_prometheus_export_says_what_it_holds(tmp_path: Path) -> None:
    """Two series of one model are refused (never summed: a duplicated version doubled a
    replay once); a gap is said and has no traffic (not the last rate carried across it);
    samples in reverse order are put in order and said; malformed entries are named by
    series and sample."""
    s = [[1000 + i, "50"] for i in range(10)]
    two = _prom([{"metric": {"model": "dense", "version": "1"}, "values": s},
                 {"metric": {"model": "dense", "version": "2"}, "values": s}])
    with pytest.raises(DatasetError, match=r"series \{model=dense, version=1\} and "
                                           r"\{model=dense, version=2\} are both model dense"):
        read_traffic(write(tmp_path / "two.json", json.dumps(two)))
    gap = [v for v in s if not 1003 <= v[0] <= 1006]  # samples 3-6 missing
    t = read_traffic(write(tmp_path / "gap.json", json.dumps(_prom(
        [{"metric": {"model": "dense"}, "values": gap}]))), seed=1)
    assert any("no samples from 2 s to 7 s (a gap of 4 samples)" in n for n in t.notes), t.notes
    assert ((t.offsets > 2.05) & (t.offsets < 6.95)).sum() == 0  # nothing carried across it
    back = read_traffic(write(tmp_path / "back.json", json.dumps(_prom(
        [{"metric": {"model": "dense"}, "values": s[::-1]}]))), seed=1)
    assert 300 < len(back.offsets) < 600 and any("out of time order" in n for n in back.notes)
    for result, said in (
            (["dense"], r"result \[0\]: expected a series"),
            ([{"metric": {"model": "dense"}, "values": [[1000, "abc"]]}],
             r"result \[0\] \{model=dense\}, sample \[0\]: expected \[unix time, \"rate\"\]; "
             r"found \[1000, 'abc'\]")):
        with pytest.raises(DatasetError, match=said):
            read_traffic(write(tmp_path / "bad.json", json.dumps(_prom(result))))


@pytest.mark.fast
def test_a_malformed_trace_or_another_kind_of_file_is_named(tmp_path: Path) -> None:
    for entries, said in (
            ([{"id": 1, "model_name": "m", "timestamps": {"name": "REQUEST_START"}}],
             r"trace \[0\] \(id 1\): expected 'timestamps' as a list"),
            ([{"id": [1], "model_name": "m"}], r"trace \[0\]: expected an id that is a number")):
        with pytest.raises(DatasetError, match=said):
            read_traffic(write(tmp_path / "t.json", json.dumps(entries)))
    data = {"data": [{"INPUT0": [1.0, 2.0]}]}
    with pytest.raises(DatasetError, match="a perf_analyzer data set .*, not traffic"):
        read_traffic(write(tmp_path / "d.json", json.dumps(data)))
    with pytest.raises(DatasetError, match="a prompts file .*, not traffic"):
        read_traffic(write(tmp_path / "p.jsonl", '"what is a queue"\n{"prompt": "hi"}\n'))


@pytest.mark.fast
def test_a_window_is_a_slice_from_zero(tmp_path: Path) -> None:
    t = read_traffic(write(tmp_path / "i.txt", "100000\n" * 50), window=(1.0, 3.0))
    assert len(t.offsets) == 20 and t.offsets[0] == pytest.approx(0.0)
    assert t.duration_s == 2.0


@pytest.mark.fast
def test_bad_files_say_where(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"t.json:1:\d+: not JSON"):
        read_traffic(write(tmp_path / "t.json", "[{]"))
    with pytest.raises(DatasetError, match="file not found"):
        read_traffic(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match=r"p.csv:3: t goes back"):
        read_traffic(write(tmp_path / "p.csv", "0,a,1\n5,a,2\n4,a,3\n"))


MOONCAKE = [
    {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]},
    {"timestamp": 250, "input_length": 520, "output_length": 2, "hash_ids": [7, 9]},
    {"timestamp": 250, "input_tokens": 30, "output_tokens": 3},  # upstream aliases
    {"timestamp": 1250.5, "input_length": 40, "output_length": 5, "hash_ids": [11]},
]


@pytest.mark.fast
def test_a_mooncake_trace_keeps_each_arrivals_line(tmp_path: Path) -> None:
    """AIPerf's mooncake rows: arrivals at their timestamps (ms), each carrying its line, so the
    replay sends that line's request; a window keeps the lines it holds."""
    path = write(tmp_path / "m.jsonl", "\n".join(json.dumps(r) for r in MOONCAKE) + "\n")
    t = read_traffic(path)
    assert t.format == "mooncake" and t.models == (ANY,) and t.in_file == 4
    assert np.allclose(t.offsets, [0, 0.25, 0.25, 1.2505]) and t.entry_of.tolist() == [0, 1, 2, 3]
    late = read_traffic(path, window=(0.2, 2.0))
    assert late.entry_of.tolist() == [1, 2, 3] and np.allclose(late.offsets[0], 0.05)


@pytest.mark.fast
def test_an_llm_template_from_a_mooncake_trace_shares_the_prefixes_it_names(tmp_path) -> None:
    """One request per line: its prompt input_length words built from its hash_ids' blocks
    (512 words each, seeded by the id: lines that share an id share that prefix), its
    max_tokens the line's output_length."""
    from loadkit.scenario import load_scenario

    write(tmp_path / "m.jsonl", "\n".join(json.dumps(r) for r in MOONCAKE) + "\n")
    scen = load_scenario(write(tmp_path / "s.yaml", """
requests:
  chat: {model: token_generator, llm: {style: vllm, trace: m.jsonl}}
phases:
  - {name: x, load: {replay: m.jsonl}}
"""))
    chat = scen.requests["chat"]
    texts = [e["text_input"][0].decode().split() for e in chat.dataset.entries]
    assert [len(t) for t in texts] == [600, 520, 30, 40]
    assert texts[0][:512] == texts[1][:512] and texts[0][512:520] != texts[1][512:520]
    asked = [json.loads(e["sampling_parameters"][0])["max_tokens"]
             for e in chat.dataset.entries]
    assert asked == [4, 2, 3, 5] and chat.llm.input_tokens_mean == (600 + 520 + 30 + 40) / 4


@pytest.mark.fast
def test_a_replay_plan_states_the_split_the_trace_sends(tmp_path: Path) -> None:
    """Three arrivals of as4 to one of ib1: the plan says 75/25 as the file sends them, not
    the mix's weights (which only pick for arrivals of no model)."""
    from loadkit.plan import build_plan
    from loadkit.scenario import load_scenario

    entries = []
    for i in range(40):
        entries += _trace(i + 1, "dense" if i % 4 else "add_sub", 10**12 + i * 10**7)
    write(tmp_path / "t.json", json.dumps(entries))
    scen = load_scenario(write(tmp_path / "s.yaml", """
requests:
  as4: {model: dense, inputs: {INPUT0: {dtype: FP32, shape: [256]}}}
  ib1:
    model: add_sub
    inputs: {INPUT0: {dtype: FP32, shape: [4]}, INPUT1: {dtype: FP32, shape: [4]}}
mix: {as4: 1, ib1: 1}
phases:
  - name: r
    load: {replay: t.json}
"""))
    said = build_plan(scen).describe()
    assert "the file sends as4 75% (30), ib1 25% (10)" in said, said
    assert "mix as4 50%" not in said


@pytest.mark.fast
def test_a_second_is_behind_only_when_its_backlog_grows() -> None:
    """Requests that complete across a second's edge (7 of 8, then 8 of 7) are not a server
    falling behind; a server serving half of a steady offer is."""
    from loadkit.report.replay import seconds_behind

    assert seconds_behind([8, 7, 8, 7], [7, 8, 7, 8]) == 0
    assert seconds_behind([10] * 5, [5] * 5) == 3  # a second of slack: from the third
    assert seconds_behind([10, 10, 0, 0], [10, 10, 0, 0]) == 0
