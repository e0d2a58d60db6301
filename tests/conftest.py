"""Shared fixtures: one real embedded Triton for the session, and a way to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The pytest process runs engines, grpc servers and threads of its own: a test that imports
# Locust (test_deploy reads Locust's argument parser) must not monkey-patch it, or every later
# thread would run on the gevent hub (seen: the whole suite hung in test_wire_hardening).
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

from loadkit.control.client import ServerControl  # noqa: E402
from loadkit.control.embedded import EmbeddedServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


FIXTURE_MODELS = ROOT / "tests" / "models"  # shapes of models users bring (its README)


@pytest.fixture(scope="session")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the fixture models that record what they receive write (LOADKIT_RECORD_DIR)."""
    return tmp_path_factory.mktemp("record")


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory, record_dir: Path) -> EmbeddedServer:
    """One server for the session: the shipped models and the fixture models (tests/models)
    side by side in one repository of links."""
    base = tmp_path_factory.mktemp("triton")
    repository = base / "models"
    repository.mkdir()
    for folder in (*sorted((ROOT / "model_repository").iterdir()),
                   *sorted(FIXTURE_MODELS.iterdir())):
        if (folder / "config.pbtxt").is_file():
            (repository / folder.name).symlink_to(folder)
    os.environ["LOADKIT_RECORD_DIR"] = str(record_dir)  # the server's env (its models read it)
    server = EmbeddedServer(model_repository=repository,
                            models=("dense", "cnn", "add_sub", "accumulate", "repeat", "blob",
                                    "text_classifier", "image_pipeline", "seq_record",
                                    "silent_stream", "bls_dense", "mixed_inputs"),
                            log_path=base / "tritonserver.log",
                            # where traces go when a test turns tracing on (`loadkit trace`)
                            extra_args=(f"--trace-config=triton,file={base / 'trace.json'}",))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def control(triton: EmbeddedServer) -> ServerControl:
    ctl = ServerControl(triton.grpc_address, metrics_url=triton.metrics_url)
    yield ctl
    ctl.close()


def loadkit(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a child process (gevent patching stays out of pytest)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "loadkit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or ROOT,
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


# ---- the one scenario builder the server tests share ----------------------------------------
def dense_b1(seed: int = 3) -> dict[str, Any]:
    """The dense model, one row per request, seeded random data."""
    return {"model": "dense", "batch_size": 1,
            "inputs": {"INPUT0": {"dtype": "FP32", "shape": [256], "data": "random",
                                  "seed": seed}}}


CNN_B4 = {"model": "cnn", "batch_size": 4,
          "inputs": {"image": {"dtype": "FP32", "shape": [3, 32, 32]}}}


def load(levels: Any, dur: str, warmup: str = "0.5s", **more: Any) -> dict[str, Any]:
    """A phase's load: `levels` a concurrency (or list of them), or a rate such as '300/s'
    (a rate needs no concurrency key)."""
    key = "rate" if isinstance(levels, str) and levels.endswith("/s") else "concurrency"
    value = levels[:-2] if key == "rate" else levels
    return {key: _number(value), "step_duration": dur, "warmup": warmup, **more}


def _number(value: Any) -> Any:
    if isinstance(value, str):
        import yaml

        return yaml.safe_load(value)  # "[2, 4]" -> [2, 4], "300" -> 300
    return value


def scenario(name: str, phases: list[dict[str, Any]], requests: dict[str, Any] | None = None,
             **top: Any) -> str:
    """A scenario's YAML from its parts: the dense model alone unless `requests` says; `top`
    adds top-level keys (target, mix, repeats, ...) in order."""
    import yaml

    doc = {"name": name, **top, "requests": requests or {"dense_b1": dense_b1()},
           "phases": phases}
    return yaml.safe_dump(doc, sort_keys=False)


def dense_cnn(
    name: str = "t", w1: int = 70, w2: int = 30, conc: str = "[2, 4]", dur: str = "3s",
    warmup: str = "0.5s",
) -> str:
    return scenario(name, [{"name": "only", "load": load(conc, dur, warmup)}],
                    {"dense_b1": dense_b1(), "cnn_b4": CNN_B4}, mix={"dense_b1": w1,
                                                                   "cnn_b4": w2})


def wait_for(condition: Any, timeout: float, what: str = "condition", poll: float = 0.02) -> Any:
    """Poll `condition()` until it is truthy and return its value; fail at the deadline."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`fast` (make test-fast) means no server: a fast test that asks for one is a mistake."""
    for item in items:
        if item.get_closest_marker("fast") and "triton" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} is marked fast but uses the triton fixture")


def steps_on_disk(out: Path, phase: int = 0) -> int:
    """How many steps of a phase the run has written to results.json (written atomically after
    every step), 0 before the file or the phase exists."""
    if not (out / "results.json").exists():
        return 0
    phases = results(out)["phases"]
    return len(phases[phase]["steps"]) if len(phases) > phase else 0


def server_successes(address: str, model: str) -> int:
    """The server's own cumulative success count for a model (0 while it cannot be read)."""
    with ServerControl(address) as ctl:
        counters, _ = ctl.read_counters((model,))
    return counters[model].success if model in counters else 0


def wait_inside_step(out: Path, address: str | None, model: str, steps_done: int,
                     phase: int = 0, margin: int = 50, timeout: float = 120) -> None:
    """Wait until `steps_done` steps of `phase` are on disk and then the server has answered
    `margin` more requests for `model`: the next step's measured window is under way. Only
    for phases with `warmup: 0s` (a warm-up would send those requests before the window
    opens). `address` None: read from results.json."""
    wait_for(lambda: steps_on_disk(out, phase) >= steps_done, timeout,
             f"{steps_done} step(s) of phase {phase} on disk")
    address = address or results(out)["target"]
    base = server_successes(address, model)
    wait_for(lambda: server_successes(address, model) >= base + margin, 60,
             f"{margin} requests of the next step")


# ---- shared helpers (tests import them from here, never from another test file) ------------
TEMPLATE_MODEL = {"dense_b1": "dense", "cnn_b4": "cnn"}  # DENSE_CNN's templates


def assert_accounted(step: dict, models: dict[str, str] | None = None) -> None:
    """Client-side successes per model == the server's success delta for that model
    (`models`: template -> model beyond DENSE_CNN's; a template named as its model needs none)."""
    names = {**TEMPLATE_MODEL, **(models or {})}
    per_model: dict[str, int] = {}
    for name, c in step["client"].items():
        model = names.get(name, name)
        per_model[model] = per_model.get(model, 0) + c["requests"]
    for model, n in per_model.items():
        assert step["server"][model]["success"] == n, (model, step["server"][model], n)
    assert sum(per_model.values()) == step["requests"]
    assert step["accounting"]["status"] == "ok", step["accounting"]  # the run checked it too
    # the timeline's seconds add up to the step exactly (merged across workers too)
    timeline = step["timeline"]
    assert sum(r["requests"] for r in timeline) == step["requests"]
    assert sum(sum(r["errors"].values()) for r in timeline) == sum(step["errors"].values())
    assert [r["t"] for r in timeline] == list(range(len(timeline)))
    assert len(timeline) >= int(step["duration_s"])


def tokenizer_file(path: Path) -> Path:
    """A real tokenizer.json, trained here with the tokenizers library (no downloads): word
    pieces, so a word is often several tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["the model serves requests under load while the scheduler batches tokens",
              "every user in the queue and the server reports its latency throughput memory",
              "so an engineer can compare configurations before a launch"] * 10 + [
              "tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9 tok0"]  # the simulator's words
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=60,
                                                              special_tokens=["[UNK]"]))
    tok.save(str(path))
    return path


def prom_api(port: int, path: str, **params: str) -> Any:
    """One call of a Prometheus HTTP API (JSON)."""
    import urllib.parse
    import urllib.request

    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?{query}", timeout=10) as resp:
        return json.loads(resp.read())


def start_prometheus(tmp_path: Path, triton: Any, loadkit_port: int) -> tuple[Any, int]:
    """Debian's Prometheus with deploy/prometheus/prometheus-local.yml, its targets pointed at
    this session's Triton and a run's --prometheus-port, scraping every second."""
    import socket
    import urllib.error

    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus-local.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    jobs["triton"]["static_configs"] = [{"targets": [triton.metrics_url.split("/")[2]]}]
    jobs["loadkit"]["static_configs"] = [{"targets": [f"127.0.0.1:{loadkit_port}"]}]
    write(tmp_path / "prometheus.yml", yaml.safe_dump(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))  # noqa: SIM115

    def ready() -> bool:
        try:
            return prom_api(port, "/api/v1/status/buildinfo")["status"] == "success"
        except (urllib.error.URLError, OSError, ValueError):
            return False

    wait_for(ready, 30, "Prometheus to answer")
    return proc, port


def parent_of(pid: int) -> int:
    """A process's parent (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def processes(pattern: str, under: int | None = None) -> set[int]:
    """The pids whose command line matches `pattern` (pgrep -f), or those of them descending
    from `under`: `make test` runs two workers, so a count of every match would see the other
    worker's servers and workers come and go."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    pids = {int(p) for p in out.stdout.split()}
    if under is None:
        return pids

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parent_of(pid)
            if pid == under:
                return True
        return False
    return {p for p in pids if descends(p)}
