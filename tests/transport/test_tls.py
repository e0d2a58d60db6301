"""TLS against a real Triton: the embedded tritonserver started with `--grpc-use-ssl` (mutual TLS),
certificates from a throwaway CA (trustme). Inferences go over loadkit's own h2 framing on
Python's ssl; admin calls (statistics, config) over grpc's SSL credentials: both must work and the
accounting must hold. A wrong CA or a missing client certificate is one clear error, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from conftest import loadkit, results, write

from loadkit.control.embedded import EmbeddedServer

# its module fixtures (a shared run or server) are built once: the file runs whole on one
# test worker (make test, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_tls")

SCENARIO = """
name: tls
target:
  grpc: "{address}"
  tls: {tls}
requests:
  dense_b1:
    model: dense
    inputs:
      INPUT0: {{dtype: FP32, shape: [256], data: random, seed: 5}}
phases:
  - name: only
    load: {{concurrency: [1, 4], step_duration: 1s, warmup: 0.2s}}
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("loadkit-client")
    paths = {name: folder / f"{name}.pem" for name in
             ("ca", "other_ca", "server_cert", "server_key", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other_ca.cert_pem.write_to_path(str(paths["other_ca"]))
    server.private_key_pem.write_to_path(str(paths["server_key"]))
    server.cert_chain_pems[0].write_to_path(str(paths["server_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    return paths


@pytest.fixture(scope="module")
def tls_triton(certs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    log = tmp_path_factory.mktemp("triton-tls") / "tritonserver.log"
    server = EmbeddedServer(models=("dense",), log_path=log, extra_args=(
        "--grpc-use-ssl=true",
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={certs['server_cert']}",
        f"--grpc-server-key={certs['server_key']}",
        f"--grpc-root-cert={certs['ca']}",
    ))
    server.start()
    yield server
    server.stop()


def _scenario(tmp_path: Path, server: EmbeddedServer, tls: dict[str, Path]) -> Path:
    body = "{" + ", ".join(f"{k}: {v}" for k, v in tls.items()) + "}"
    return write(tmp_path / "s.yaml", SCENARIO.format(address=server.grpc_address, tls=body))


def test_mutual_tls_run_is_served_and_counted(tls_triton, certs, tmp_path) -> None:
    scen = _scenario(tmp_path, tls_triton, {
        "root_certs": certs["ca"], "client_cert": certs["client_cert"],
        "client_key": certs["client_key"]})
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = results(out)["phases"][0]["steps"]
    assert [s["load"]["concurrency"] for s in steps] == [1, 4]
    for step in steps:
        assert step["status"] == "ok", step
        assert step["requests"] > 50, step
        assert step["errors"] == {}, step["errors"]
        # the server's statistics (read over TLS too) agree with the client, request for request
        assert step["server"]["dense"]["success"] == step["requests"], step


@pytest.mark.parametrize("case", ["wrong_ca", "no_client_cert", "plaintext"])
def test_tls_mismatch_is_one_clear_error(tls_triton, certs, tmp_path, case) -> None:
    tls = {
        "wrong_ca": {"root_certs": certs["other_ca"], "client_cert": certs["client_cert"],
                     "client_key": certs["client_key"]},
        "no_client_cert": {"root_certs": certs["ca"]},
        "plaintext": None,
    }[case]
    if tls is None:
        scen = write(tmp_path / "s.yaml", SCENARIO.replace("  tls: {tls}\n", "").format(
            address=tls_triton.grpc_address))
    else:
        scen = _scenario(tmp_path, tls_triton, tls)
    out = tmp_path / "r"
    proc = loadkit("run", str(scen), "--out", str(out), timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert tls_triton.grpc_address in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no grpc log lines around it
    hint = {"wrong_ca": "check target.tls.root_certs", "plaintext": "set target.tls",
            "no_client_cert": "set target.tls.client_cert and client_key"}[case]
    assert hint in proc.stderr, proc.stderr
    assert not (out / "results.json").exists()  # no load was sent, so there is nothing to report
