"""Every YAML example in README.md and docs/*.md is a scenario loadkit accepts: a whole
scenario as written, a fragment (a template, a phase, a section) completed with the fewest
keys around it. The whole scenarios whose models the session's Triton has are also run, with
their steps shortened. An example that drifts from the code fails here."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, loadkit, results, tokenizer_file, write

from loadkit.scenario import load_scenario
from loadkit.scenario.source import parse_text

# its module fixtures (a shared run or server) are built once: the file runs whole on one
# test worker (make test, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_docs_examples")

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a block fenced as ```yaml ci is a CI pipeline, not a scenario (tests/report/test_ci.py runs it)
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
PHASE_KEYS = {"name", "load", "config", "requires", "thresholds", "mix"}
BASE_REQUESTS = {"dense_b1": {"model": "dense", "inputs": {
    "INPUT0": {"dtype": "FP32", "shape": [256]}}}}
BASE_PHASES = [{"name": "example", "load": {"concurrency": 1, "step_duration": "1s"}}]
# models the session's Triton serves (tests/conftest.py): examples naming only these run
SERVED = {"dense", "cnn", "add_sub", "accumulate", "repeat", "blob", "text_classifier",
          "image_pipeline", "seq_record", "silent_stream", "bls_dense"}


def _examples() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 2
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1)))
    return out


EXAMPLES = _examples()


def complete(text: str) -> tuple[dict[str, Any], bool]:
    """(the example as a whole scenario, whether it was one as written)."""
    data = parse_text(textwrap.dedent(text)).data
    if isinstance(data, list):  # phase list items
        phases = [{"load": BASE_PHASES[0]["load"], **p} for p in data]
        return {"requests": BASE_REQUESTS, "phases": phases}, False
    assert isinstance(data, dict), data
    if set(data) <= PHASE_KEYS and "requests" not in data:  # one phase's keys
        phase = {"name": "example", "load": BASE_PHASES[0]["load"], **data}
        return {"requests": BASE_REQUESTS, "phases": [phase]}, False
    whole = "requests" in data and ("phases" in data or "tune" in data)
    out = dict(data)
    out.setdefault("requests", BASE_REQUESTS)
    if "phases" not in out and "tune" not in out:
        out["phases"] = BASE_PHASES
    if "templates" in out.get("thresholds", {}):
        out["requests"] = {**BASE_REQUESTS, **{n: BASE_REQUESTS["dense_b1"] for n in
                                               out["thresholds"]["templates"]
                                               if n not in out["requests"]}}
    return out, whole


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the files examples name exist: the shipped data/, and stand-ins for the
    user's own prompts, tokenizer and TLS files."""
    d = tmp_path_factory.mktemp("examples")
    (d / "data").symlink_to(ROOT / "scenarios" / "data")
    write(d / "prompts.jsonl", '"what does the scheduler do"\n{"prompt": "serve the model"}\n')
    tokenizer_file(d / "tokenizer.json")
    for name in ("ca.pem", "client.pem", "client.key"):
        write(d / name, "")
    return d


@pytest.mark.fast
def test_a_ramp_in_an_example_stays_a_ramp() -> None:
    """YAML 1.1 reads 2:16:2 as the base-60 integer 8162: the examples are read as loadkit reads
    a scenario, and written back as they were written."""
    scenario, _ = complete("phases: [{name: x, load: {concurrency: 2:16:2}}]")
    assert scenario["phases"][0]["load"]["concurrency"] == "2:16:2"
    assert "2:16:2" in yaml.safe_dump(scenario)


@pytest.mark.fast
def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 20, [w for w, _ in EXAMPLES]


@pytest.mark.parametrize("where,text", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_every_yaml_example_is_accepted(where: str, text: str, example_dir: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_TOKEN", "example-token")
    scenario, _ = complete(text)
    path = write(example_dir / "example.yaml", yaml.safe_dump(scenario, sort_keys=False))
    load_scenario(path)  # raises ScenarioError with file:line if the example drifted


def _runnable(text: str) -> bool:
    """A whole scenario, or one whose templates the example writes itself."""
    whole = complete(text)[1]
    data = parse_text(textwrap.dedent(text)).data
    return whole or (isinstance(data, dict) and "requests" in data)


RUNNABLE = [(w, t) for w, t in EXAMPLES if _runnable(t)]


@pytest.mark.parametrize("where,text", RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_examples_with_requests_run_shortened(where: str, text: str, triton, tmp_path: Path,
                                              example_dir: Path) -> None:
    """Run against the session's Triton with 0.5 s steps at concurrency 1 and 2."""
    scenario, _ = complete(text)
    models = {t.get("model") for t in scenario["requests"].values()}
    if not models <= SERVED:
        pytest.skip(f"{where} names models the test server does not load: "
                    f"{', '.join(sorted(models - SERVED))}")
    short = yaml.safe_dump(scenario, sort_keys=False)
    short = re.sub(r"step_duration: *\w+", "step_duration: 0.5s", short)
    short = re.sub(r"warmup: *\w+", "warmup: 0.1s", short)
    short = re.sub(r"concurrency:\n(?: *- *\d+\n)+", "concurrency: [1, 2]\n", short)
    out = tmp_path / "r"
    proc = loadkit("run", str(write(example_dir / f"{tmp_path.name}.yaml", short)),
                   "--target", triton.grpc_address, "--out", str(out), "--quiet")
    assert proc.returncode == 0, (where, proc.stderr[-2000:])
    assert results(out)["status"] == "complete"
