"""https:// for the HTTP door: Triton's HTTP endpoint has no TLS of its own, so Debian's socat
(OpenSSL) terminates TLS in front of the session Triton's HTTP port, as a load balancer or an
ingress does. Certificates from a throwaway CA (trustme). With the CA the run is served and
counted (inferences and the control plane both over TLS); without it, one clear error naming
target.tls.root_certs, exit 2, nothing sent."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import trustme
from conftest import load, loadkit, results, scenario, wait_for, write

from loadkit.control.embedded import free_port

pytestmark = [pytest.mark.xdist_group("https"),
              pytest.mark.skipif(shutil.which("socat") is None,
                                 reason="no socat (make test installs Debian's package as root)")]


@pytest.fixture(scope="module")
def tls_front(triton, tmp_path_factory: pytest.TempPathFactory):
    """socat listening with TLS on a free port, forwarding to the session Triton's HTTP port:
    (https address, the CA's file)."""
    folder = tmp_path_factory.mktemp("https")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    pem, ca_file = folder / "server.pem", folder / "ca.pem"
    pem.write_bytes(cert.private_key_pem.bytes() + b"".join(c.bytes() for c in
                                                            cert.cert_chain_pems))
    ca.cert_pem.write_to_path(str(ca_file))
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(["socat", f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,"
                             f"cert={pem},verify=0", f"TCP:{triton.http_address}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, 10, "socat to listen")
        yield f"https://127.0.0.1:{port}", ca_file
    finally:
        proc.terminate()
        proc.wait(10)


def test_https_with_the_ca_is_served_and_counted(tls_front, tmp_path: Path) -> None:
    url, ca = tls_front
    yaml = scenario("https", [{"name": "p", "load": load("[1, 4]", "1s")}],
                    target={"url": url, "tls": {"root_certs": str(ca)}})
    out = tmp_path / "r"
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = results(out)
    assert data["target"] == url
    for step in data["phases"][0]["steps"]:
        assert step["accounting"]["status"] == "ok", step["accounting"]
        assert step["server"]["dense"]["success"] == step["requests"] > 0


def test_https_without_the_ca_is_one_clear_error(tls_front, tmp_path: Path) -> None:
    url, _ = tls_front
    yaml = scenario("noca", [{"name": "p", "load": load(1, "1s")}], target={"url": url})
    proc = loadkit("run", str(write(tmp_path / "s.yaml", yaml)), "--out", str(tmp_path / "r"),
                   timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "target.tls.root_certs" in proc.stderr and "Traceback" not in proc.stderr, (
        proc.stderr)
