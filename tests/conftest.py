"""Shared fixtures: one real embedded Triton for the session, and a way to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadkit.control.server import ServerControl
from loadkit.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    server = EmbeddedServer(models=("dense", "cnn", "add_sub", "accumulate", "repeat", "blob"),
                            log_path=log)
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


DENSE_CNN = """
name: {name}
requests:
  dense_b1:
    model: dense
    batch_size: 1
    inputs:
      INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 3}}
  cnn_b4:
    model: cnn
    batch_size: 4
    inputs:
      image: {{dtype: FP32, shape: [3, 32, 32]}}
mix: {{dense_b1: {w1}, cnn_b4: {w2}}}
phases:
  - name: only
    load: {{concurrency: {conc}, step_duration: {dur}, warmup: 0.5s}}
"""


def dense_cnn(
    name: str = "t", w1: int = 70, w2: int = 30, conc: str = "[2, 4]", dur: str = "3s"
) -> str:
    return DENSE_CNN.format(name=name, w1=w1, w2=w2, conc=conc, dur=dur)


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
