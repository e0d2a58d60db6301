"""The scenario's `target:` section: where load goes and how the client talks to it."""

from __future__ import annotations

import re
from typing import Any

from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import (
    PROTOCOLS,
    SERVER_LOSS_POLICIES,
    SERVER_LOSS_WAIT_S,
    TRANSPORTS,
    TargetSpec,
    TLSSpec,
)
from loadkit.scenario.source import KeyPath

SHARED_MEMORY = ("none", "system", "cuda")
URL = re.compile(r"^(https?|grpc)://[\w.\-\[\]:]+:\d+/?$")


def _target(ck: Checker, raw: Any) -> TargetSpec:
    path: KeyPath = ("target",)
    m = ck.mapping(
        raw, path, ("grpc", "url", "protocol", "http", "tls", "headers", "timeout", "metrics",
                    "transport", "on_server_loss", "server_loss_wait", "reload_timeout",
                    "max_message_size", "shared", "shared_memory", "output_shared_memory_size"),
    )
    if m is None:
        return TargetSpec()
    grpc_addr = None
    if "grpc" in m:
        grpc_addr = ck.string(m["grpc"], (*path, "grpc"), "a host:port such as 127.0.0.1:8001")
        if grpc_addr and not re.match(r"^[\w.\-\[\]:]+:\d+$", grpc_addr):
            ck.add(
                (*path, "grpc"), f"expected host:port such as 127.0.0.1:8001; found {grpc_addr!r}"
            )
    url, protocol, binary = _door(ck, m, path, grpc_addr)
    tls = None
    if "tls" in m:
        t = ck.mapping(m["tls"], (*path, "tls"), ("root_certs", "client_cert", "client_key"))
        if t is not None:
            files = {
                k: ck.file(v, (*path, "tls", k))
                for k, v in t.items()
                if k in TLSSpec.__annotations__
            }
            if ("client_cert" in t) != ("client_key" in t):
                ck.add((*path, "tls"), "client_cert and client_key go together")
            tls = TLSSpec(**files)
    headers: list[tuple[str, str]] = []
    if "headers" in m:
        h = m["headers"]
        if not isinstance(h, dict):
            ck.add((*path, "headers"), f"expected a mapping of header -> value; found {found(h)}")
        else:
            for k, v in h.items():
                if not isinstance(v, str):
                    ck.add((*path, "headers", k), f"expected a string; found {found(v)}")
                    continue
                headers.append((k.lower(), ck.env(v, (*path, "headers", k))))
    timeout = ck.duration(m["timeout"], (*path, "timeout"), False) if "timeout" in m else 10.0
    metrics = None
    if "metrics" in m:
        metrics = ck.string(m["metrics"], (*path, "metrics"), "a URL such as http://host:8002/metrics")
        if metrics and not re.match(r"^https?://[^\s/]+(/\S*)?$", metrics):
            ck.add(
                (*path, "metrics"),
                f"expected a URL such as http://127.0.0.1:8002/metrics; found {metrics!r}",
            )
            metrics = None
    transport = ck.choice(m, "transport", path, TRANSPORTS, "stream")
    policy = ck.choice(m, "on_server_loss", path, SERVER_LOSS_POLICIES, "abort")
    wait_s = SERVER_LOSS_WAIT_S[policy]
    if "server_loss_wait" in m:
        wait_s = ck.duration(m["server_loss_wait"], (*path, "server_loss_wait"), False) or wait_s
    reload_s = 120.0
    if "reload_timeout" in m:
        reload_s = ck.duration(m["reload_timeout"], (*path, "reload_timeout"), False) or reload_s
    max_bytes = 4 << 20
    if "max_message_size" in m:
        max_bytes = ck.size(m["max_message_size"], (*path, "max_message_size")) or max_bytes
    shm = ck.choice(m, "shared_memory", path, SHARED_MEMORY, "none")
    out_bytes = 0
    if "output_shared_memory_size" in m:
        out_bytes = ck.size(m["output_shared_memory_size"], (*path, "output_shared_memory_size"))
        if shm == "none":
            ck.add((*path, "output_shared_memory_size"), "sizes the output regions of "
                   "shared_memory: system; expected shared_memory beside it")
    return TargetSpec(
        shared_memory=shm, output_shm_bytes=out_bytes or 0,
        grpc=grpc_addr, url=url, protocol=protocol, http_binary=binary, tls=tls,
        headers=tuple(headers), timeout_s=timeout or 10.0,
        secret_values=tuple(ck.secrets), metrics=metrics, transport=transport,
        on_server_loss=policy, server_loss_wait_s=wait_s, reload_timeout_s=reload_s,
        max_message_bytes=max_bytes, shared=ck.boolean(m, "shared", path, False),
    )


def _door(ck: Checker, m: dict[str, Any], path: KeyPath,
          grpc_addr: str | None) -> tuple[str | None, str, bool]:
    """Which door (url's scheme, or protocol) and its options: (url, protocol, binary)."""
    url = None
    if "url" in m:
        url = ck.string(m["url"], (*path, "url"), "a URL such as http://127.0.0.1:8000")
        if url and not URL.match(url):
            ck.add((*path, "url"), "expected http://host:port, https://host:port or "
                   f"grpc://host:port such as http://127.0.0.1:8000; found {url!r}")
            url = None
        if url and grpc_addr:
            ck.add((*path, "url"), "give the address once: url or grpc, not both")
    protocol = ck.choice(m, "protocol", path, PROTOCOLS, "grpc")
    if url and "protocol" in m and not url.startswith(protocol):
        ck.add((*path, "protocol"), f"the url says {url.split(':')[0]}, protocol says "
               f"{protocol}: give the door once (the url's scheme)")
    binary = True
    if "http" in m:
        h = ck.mapping(m["http"], (*path, "http"), ("binary",))
        if h is not None:
            binary = ck.boolean(h, "binary", (*path, "http"), True)
    if "transport" in m and (protocol == "http" or (url or "").startswith("http")):
        ck.add((*path, "transport"), "transport (stream | unary) chooses between gRPC's "
               "calls; over HTTP every request is one call: remove it")
    return url, protocol, binary
