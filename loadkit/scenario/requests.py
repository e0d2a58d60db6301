"""The request templates, their inputs, the target and the mix."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from loadkit.errors import suggest
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.model import (
    DATA_KINDS,
    DTYPES,
    SERVER_LOSS_POLICIES,
    SERVER_LOSS_WAIT_S,
    TRANSPORTS,
    InputSpec,
    RequestTemplate,
    TargetSpec,
    TLSSpec,
)
from loadkit.scenario.source import KeyPath


def _inputs(ck: Checker, raw: Any, path: KeyPath) -> tuple[InputSpec, ...]:
    if not isinstance(raw, dict) or not raw:
        ck.add(
            path, f"expected a mapping of input name -> {{dtype, shape, data}}; found {found(raw)}"
        )
        return ()
    out = []
    for name, spec in raw.items():
        p = (*path, name)
        m = ck.mapping(
            spec, p, ("dtype", "shape", "data", "value", "seed", "file"), ("dtype", "shape")
        )
        if m is None:
            continue
        dtype = m.get("dtype")
        if dtype is not None and dtype not in DTYPES:
            extra = " (BYTES inputs are not supported yet)" if dtype == "BYTES" else ""
            ck.add((*p, "dtype"), f"expected one of {', '.join(DTYPES)}; found {dtype!r}{extra}")
            dtype = None
        shape = m.get("shape")
        if "shape" in m and (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)
        ):
            ck.add(
                (*p, "shape"),
                f"expected a list of positive integers such as [3, 224, 224]; found {shape!r}",
            )
            shape = None
        data = m.get("data", "random")
        if data not in DATA_KINDS:
            ck.add((*p, "data"), f"expected one of {', '.join(DATA_KINDS)}; found {data!r}")
            continue
        value: Any = 0
        if data == "constant":
            if "value" not in m:
                ck.add(p, "data: constant needs a 'value'")
            elif not isinstance(m["value"], (int, float)):
                ck.add((*p, "value"), f"expected a number; found {found(m['value'])}")
            else:
                value = m["value"]
        elif "value" in m:
            ck.add((*p, "value"), f"'value' only goes with data: constant (data is {data})")
        seed = 0
        if "seed" in m:
            if data != "random":
                ck.add((*p, "seed"), f"'seed' only goes with data: random (data is {data})")
            else:
                seed = ck.integer(m["seed"], (*p, "seed"), 0) or 0
        file = None
        if data == "file":
            if "file" not in m:
                ck.add(p, "data: file needs a 'file' (a .npy path relative to the scenario)")
            else:
                file = ck.file(m["file"], (*p, "file"))
        elif "file" in m:
            ck.add((*p, "file"), f"'file' only goes with data: file (data is {data})")
        if dtype is None or shape is None:
            continue
        spec_out = InputSpec(str(name), dtype, tuple(shape), data, value, seed, file)
        if file is not None:
            _check_npy(ck, spec_out, (*p, "file"))
        out.append(spec_out)
    return tuple(out)


def _check_npy(ck: Checker, spec: InputSpec, path: KeyPath) -> None:
    assert spec.file is not None
    try:
        arr = np.load(spec.file, allow_pickle=False)
    except (OSError, ValueError) as exc:
        ck.add(path, f"cannot read {spec.file.name} as a .npy array: {exc}")
        return
    if tuple(arr.shape) != spec.shape and tuple(arr.shape[1:]) != spec.shape:
        ck.add(
            path,
            f"{spec.file.name} has shape {list(arr.shape)}; expected {list(spec.shape)} "
            f"or [batch, {', '.join(map(str, spec.shape))}]",
        )


def _template(ck: Checker, name: str, raw: Any, path: KeyPath) -> RequestTemplate | None:
    m = ck.mapping(
        raw, path, ("model", "version", "batch_size", "inputs", "outputs"), ("model", "inputs")
    )
    if m is None:
        return None
    model = ck.string(m.get("model"), (*path, "model"), "a model name") if "model" in m else None
    version = m.get("version", "")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str):
        ck.add((*path, "version"), f"expected a version number or string; found {found(version)}")
        version = ""
    batch = ck.integer(m.get("batch_size", 1), (*path, "batch_size"), 1)
    inputs = _inputs(ck, m["inputs"], (*path, "inputs")) if "inputs" in m else ()
    outputs = m.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        ck.add((*path, "outputs"), f"expected a list of output names; found {found(outputs)}")
        outputs = []
    if model is None or batch is None or not inputs:
        return None
    return RequestTemplate(name, model, batch, inputs, tuple(outputs), version)


def _target(ck: Checker, raw: Any) -> TargetSpec:
    path: KeyPath = ("target",)
    m = ck.mapping(
        raw, path, ("grpc", "tls", "headers", "timeout", "metrics", "transport",
                    "on_server_loss", "server_loss_wait", "reload_timeout", "max_message_size",
                    "shared"),
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
    return TargetSpec(
        grpc_addr, tls, tuple(headers), timeout or 10.0, tuple(ck.secrets), metrics, transport,
        policy, wait_s, reload_s, max_bytes, ck.boolean(m, "shared", path, False),
    )


def _mix(ck: Checker, raw: Any, names: list[str]) -> dict[str, float]:
    if raw is None:
        return {n: 1.0 for n in names}
    if not isinstance(raw, dict) or not raw:
        ck.add(("mix",), f"expected a mapping of request name -> weight; found {found(raw)}")
        return {}
    out: dict[str, float] = {}
    for name, weight in raw.items():
        if name not in names:
            hint = suggest(name, names)
            ck.add(
                ("mix", name),
                f"no request named '{name}' in requests{hint} (have: {', '.join(names)})",
            )
            continue
        w = ck.number(weight, ("mix", name), 0, exclusive=False)
        if w is not None:
            out[name] = w
    if out and sum(out.values()) <= 0:
        ck.add(("mix",), "the mix weights sum to 0; expected at least one weight > 0")
    return {k: v for k, v in out.items() if v > 0}
