"""The control plane over HTTP/REST (KServe v2 and Triton's extensions): the same questions
as client.py's gRPC client, for a target reached by `http://` or `https://` (its gRPC port may
be closed). Triton's HTTP JSON keeps protobuf's field names, so what the rest of loadkit reads
(metadata, config, statistics) is the same dict either way."""

from __future__ import annotations

import json
from typing import Any

import requests

from loadkit.control.client import ServerControl
from loadkit.errors import ControlError
from loadkit.scenario import TargetSpec

# Triton's HTTP statuses for its errors, as the gRPC status names callers know
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
          404: "NOT_FOUND", 500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE"}


class HttpControl(ServerControl):
    """A control client over one requests.Session (keep-alive), TLS from target.tls."""

    door = "HTTP"

    def __init__(self, address: str, target: TargetSpec | None = None,
                 metrics_url: str | None = None):
        target = target or TargetSpec()
        self.address = address
        self.base = address.rstrip("/")
        self.metrics_url = metrics_url or target.metrics
        self.tls = target.tls
        self.session = requests.Session()
        self.session.headers.update(dict(target.headers))
        self.session.headers["User-Agent"] = "loadkit"
        # given with every request: requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override
        # a session's own `verify`, which would drop target.tls.root_certs without a word
        self.verify: bool | str = True
        self.cert: tuple[str, str] | None = None
        if self.base.startswith("https://") and target.tls is not None:
            tls = target.tls
            if tls.root_certs:
                self.verify = str(tls.root_certs)
            if tls.client_cert and tls.client_key:
                self.cert = (str(tls.client_cert), str(tls.client_key))

    def close(self) -> None:
        self.session.close()

    def _request(self, method: str, path: str, timeout_s: float,
                 body: dict[str, Any] | None = None) -> Any:
        try:
            resp = self.session.request(method, self.base + path, timeout=timeout_s,
                                        data=None if body is None else json.dumps(body),
                                        verify=self.verify, cert=self.cert)
        except requests.exceptions.SSLError as exc:
            raise ControlError(f"TLS handshake failed: {exc}", "UNAVAILABLE") from None
        except requests.exceptions.Timeout:
            raise ControlError(f"no answer within {timeout_s:g} s", "DEADLINE_EXCEEDED") from None
        except requests.exceptions.ConnectionError as exc:
            raise ControlError(f"failed to connect to {self.address}: {_reason(exc)}",
                               "UNAVAILABLE") from None
        if resp.status_code != 200:
            try:
                text = str(resp.json().get("error", "")) or resp.text
            except ValueError:
                text = resp.text
            raise ControlError(text.strip() or f"HTTP {resp.status_code}",
                               STATUS.get(resp.status_code, "UNKNOWN"))
        return resp.json() if resp.content else {}

    def rpc(self, method: str, request: Any, timeout_s: float) -> Any:
        raise ControlError(f"{method} is a gRPC call; this target is reached over HTTP")

    def is_live(self, timeout_s: float = 1.0) -> bool:
        try:
            self._request("GET", "/v2/health/live", timeout_s)
        except ControlError as exc:
            return exc.code != "UNAVAILABLE"
        return True

    def live(self) -> bool:
        self._request("GET", "/v2/health/live", 2)
        return True

    def metadata_of(self, name: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v2/models/{name}", 5))

    def index(self) -> list[dict[str, Any]]:
        return list(self._request("POST", "/v2/repository/index", 5, {}))

    def statistics(self, name: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v2/models/{name}/stats", 10))

    def config(self, name: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v2/models/{name}/config", 10))

    def trace_settings(self, model: str, settings: dict[str, list[str]] | None = None
                       ) -> dict[str, list[str]]:
        path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
        if settings is None:
            got = self._request("GET", path, 10)
        else:  # trace_level is a list, the rest strings; an empty list clears one (null)
            got = self._request("POST", path, 10, {
                k: (v if k == "trace_level" else v[0]) if v else None
                for k, v in settings.items()})
        return {k: v if isinstance(v, list) else [str(v)] for k, v in got.items()}

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._request("POST", f"/v2/systemsharedmemory/region/{name}/register", 10,
                      {"key": key, "offset": 0, "byte_size": byte_size})

    def unregister_system_shm(self, name: str) -> None:
        self._request("POST", f"/v2/systemsharedmemory/region/{name}/unregister", 10, {})

    def system_shm_regions(self) -> list[str]:
        return [r["name"] for r in self._request("GET", "/v2/systemsharedmemory/status", 10)]

    def load(self, name: str, config: dict[str, Any] | None = None,
             timeout_s: float = 300.0) -> None:
        body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
        self._request("POST", f"/v2/repository/models/{name}/load", timeout_s, body)

    def unload(self, name: str) -> None:
        self._request("POST", f"/v2/repository/models/{name}/unload", 60, {})

    def model_ready(self, name: str) -> bool:
        try:
            self._request("GET", f"/v2/models/{name}/ready", 5)
        except ControlError:
            return False
        return True


def _reason(exc: Exception) -> str:
    """The socket's own words under requests' wrapping ("Connection refused")."""
    text = str(exc)
    for words in ("Connection refused", "Name or service not known", "timed out",
                  "Connection reset"):
        if words in text:
            return words
    return text


def connect(address: str, target: TargetSpec | None = None,
            metrics_url: str | None = None) -> ServerControl:
    """The control client for `address`'s door: http(s):// over HTTP, else gRPC."""
    if address.startswith(("http://", "https://")):
        return HttpControl(address, target, metrics_url)
    return ServerControl(address.removeprefix("grpc://"), target, metrics_url)
