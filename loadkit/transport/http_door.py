"""The HTTP/REST door (KServe v2 over HTTP/1.1): each pool entry written once as a whole
`POST /v2/models/M/infer` request, with the binary tensor extension by default (a JSON
inference header, `Inference-Header-Content-Length`, then the raw tensors; outputs asked for
binary), JSON tensors with `http: {binary: false}`.

HTTP/1.1 has no multiplexing, so each slot keeps its own keep-alive connection: as many
connections as requests in flight, opened on first use and again after a deadline (a request
cannot be cancelled on the wire other than by closing its connection) or a loss. A response is
parsed by hand (status line, Content-Length or chunked, the inference header's length) and
handed to the engine whole; its outputs are read only for validation.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from typing import Any

import numpy as np

from loadkit.errors import TargetError
from loadkit.scenario import DTYPES, RequestTemplate, TargetSpec
from loadkit.transport.call import InferError
from loadkit.transport.door import Outputs, Refs, Tensors, Ticket, connect_for, live
from loadkit.transport.http_conn import END, ERROR_BODY, HttpConn

BACKOFF_S = (1.0, 120.0)  # as the gRPC door's: first wait after a failed connect, the most


def _json_data(arr: np.ndarray, dtype: str, where: str = "") -> list[Any]:
    """A tensor's elements as JSON values; BYTES must be UTF-8 text (JSON has no bytes)."""
    if dtype != "BYTES":
        return arr.ravel().tolist()
    try:
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in arr.ravel()]
    except UnicodeDecodeError as exc:
        raise TargetError(
            f"{where}: a BYTES element is not UTF-8 text ({exc.reason} at byte {exc.start}), "
            "and JSON tensors carry only text: use the binary tensor extension (target.http: "
            "{binary: true}, the default) or the generate endpoint's text fields") from None


class HttpEncoder:
    """Whole HTTP/1.1 requests: head, inference header (its `parameters` last, so a sequence's
    flags go in without encoding the request again), raw tensors."""

    name = "http"

    def __init__(self, target: TargetSpec | None = None, authority: str = ""):
        target = target or TargetSpec()
        self.authority = authority
        self.binary = target.http_binary
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in target.headers)

    def head(self, path: str, authority: str, header_len: int, total: int) -> bytes:
        binary = f"Inference-Header-Content-Length: {header_len}\r\n" if self.binary else ""
        return (f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n"
                f"Content-Type: application/{'octet-stream' if self.binary else 'json'}\r\n"
                f"{binary}Content-Length: {total}\r\n{self.extra}\r\n").encode()

    def encode(self, template: RequestTemplate, tensors: Tensors, inputs: Refs | None = None,
               outputs: Refs | None = None) -> bytes:
        from loadkit.transport.payloads import tensor_bytes  # payloads imports door.py

        path = f"/v2/models/{template.model}"
        if template.version:
            path += f"/versions/{template.version}"
        path += f"/{template.endpoint}"
        if template.endpoint != "infer":
            return self._generate(path, template, tensors)
        entries, blobs = [], []
        for spec, arr in tensors:
            entry: dict[str, Any] = {"name": spec.name, "datatype": spec.dtype,
                                     "shape": list(arr.shape)}
            if inputs:
                entry["parameters"] = _region(inputs[spec.name])
            elif self.binary:
                raw = tensor_bytes(arr, spec.dtype)
                entry["parameters"] = {"binary_data_size": len(raw)}
                blobs.append(raw)
            else:
                entry["data"] = _json_data(arr, spec.dtype,
                                           f"request template '{template.name}' input "
                                           f"'{spec.name}'")
            entries.append(entry)
        header: dict[str, Any] = {"inputs": entries}
        if outputs:
            header["outputs"] = [{"name": n, "parameters": _region(r)} for n, r in outputs.items()]
        elif template.outputs:
            header["outputs"] = [{"name": n, "parameters": {"binary_data": self.binary}}
                                 for n in template.outputs]
        params = dict(template.parameters)
        if self.binary and not template.outputs and not outputs:
            params["binary_data_output"] = True
        header["parameters"] = params  # last: in_sequence adds to it
        text = json.dumps(header, separators=(",", ":")).encode()
        body = text + b"".join(blobs)
        return self.head(path, self.authority, len(text), len(body)) + body

    def _generate(self, path: str, template: RequestTemplate, tensors: Tensors) -> bytes:
        """The generate extension's JSON: each input a field (one element: its value, else a
        list), the template's parameters as `parameters`."""
        fields: dict[str, Any] = {}
        for spec, arr in tensors:
            values = _json_data(arr, spec.dtype, f"request template '{template.name}' input "
                                                 f"'{spec.name}' (endpoint: {template.endpoint})")
            fields[spec.name] = values[0] if len(values) == 1 else values
        if template.parameters:
            fields["parameters"] = dict(template.parameters)
        body = json.dumps(fields, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.authority}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{self.extra}\r\n").encode()
        return head + body

    def sequence_id(self, id_type: str, corr: int) -> bytes:
        return b'"sequence_id":' + (f'"{corr}"' if id_type == "string" else str(corr)).encode()

    def in_sequence(self, wire: bytes, ids: bytes, first: bool, last: bool) -> bytes:
        """The request with a sequence's id and START / END flags in its parameters."""
        end = wire.index(b"\r\n\r\n") + 4
        head, body = wire[:end], wire[end:]
        header_len = int(_header(head, b"inference-header-content-length") or len(body))
        header, rest = body[:header_len], body[header_len:]
        flags = [ids]
        if first:
            flags.append(b'"sequence_start":true')
        if last:
            flags.append(b'"sequence_end":true')
        sep = b"" if header.endswith(b"{}}") else b","
        header = header[:-2] + sep + b",".join(flags) + b"}}"
        path = head.split(b" ", 2)[1].decode()
        authority = _header(head, b"host") or ""
        return self.head(path, authority, len(header), len(header) + len(rest)) + header + rest


def _region(ref: tuple[str, int, int]) -> dict[str, Any]:
    return {"shared_memory_region": ref[0], "shared_memory_offset": ref[1],
            "shared_memory_byte_size": ref[2]}


def _header(head: bytes, name: bytes) -> str | None:
    m = re.search(rb"\r\n" + name + rb":\s*([^\r]*)", head, re.IGNORECASE)
    return m.group(1).decode() if m else None


class HttpDoor:
    """Requests over per-slot keep-alive connections to one HTTP endpoint."""

    def __init__(self, *, address: str, target: TargetSpec, loop: asyncio.AbstractEventLoop,
                 unary: bool = False, tls: bool = False):
        del unary  # every HTTP request is one call
        self.encoder = HttpEncoder(target, address)
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.authority = address.encode()
        self.target = target
        self.loop = loop
        self.connects = 0
        self.conns: set[HttpConn] = set()
        self._retry_at = 0.0
        self._backoff = BACKOFF_S[0]
        self._ssl = _ssl_context(target) if tls else None

    def put(self, ticket: Ticket, payload: bytes) -> None:
        conn = ticket.conn
        if conn is not None and not conn.closed:
            ticket.call = conn if ticket.decoupled else None
            conn.send(payload, ticket.reply)
        else:
            ticket.conn = None
            self.loop.create_task(self._connect_and_put(ticket, ticket.seq, payload))

    async def _connect_and_put(self, ticket: Ticket, seq: int, payload: bytes) -> None:
        conn = await connect_for(ticket, seq, self._connect)
        if conn is None:
            return
        if live(ticket, seq):
            ticket.conn = conn
            ticket.call = conn if ticket.decoupled else None
            conn.send(payload, ticket.reply)
        else:
            conn.close()

    async def _connect(self) -> HttpConn:
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(HttpConn, self.host, self.port, ssl=self._ssl,
                                            server_hostname=self.host if self._ssl else None),
                self.target.timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_S[1])
            raise InferError("UNAVAILABLE", f"cannot connect to {self.authority.decode()}: "
                             f"{exc}") from None
        self._backoff = BACKOFF_S[0]
        self.connects += 1
        self.conns = {c for c in self.conns if not c.closed}
        self.conns.add(conn)
        return conn

    def more(self, ticket: Ticket) -> None:
        assert ticket.conn is not None and ticket.reply is not None
        ticket.conn.wait(ticket.reply)

    def retry(self, ticket: Ticket) -> None:
        ticket.conn = None
        self.put(ticket, ticket.payload)

    def cancel(self, ticket: Ticket, error: InferError) -> None:
        """An HTTP/1.1 request is cancelled by closing its connection."""
        del error  # the engine tells the sender itself
        conn, ticket.conn, ticket.call = ticket.conn, None, None
        if conn is not None:
            conn.waiter = None
            conn.close()

    def own_us(self, ticket: Ticket, latency_us: int, end_ns: int) -> int:
        conn = ticket.conn
        if conn is None or conn.tx_ns < ticket.sent_ns:
            return 0
        rx_ns = conn.rx_ns if conn.rx_ns > conn.tx_ns else end_ns
        return max(0, latency_us - (rx_ns - conn.tx_ns) // 1000)

    def error_in(self, message: bytes) -> str | None:
        """A generate response (or event) that is an error (Triton answers some with 200)."""
        if not message.startswith(ERROR_BODY):
            return None  # an infer error is an HTTP status, already the request's error
        try:
            return str(json.loads(message).get("error", "")) or message.decode()
        except ValueError:
            return message.decode(errors="replace")

    def outputs(self, ticket: Ticket, message: bytes) -> Outputs:
        conn = ticket.conn
        header_len = conn.header_len if conn is not None and conn.header_len else len(message)
        header = json.loads(message[:header_len])
        out: Outputs = {}
        pos = header_len
        for o in header.get("outputs", []):
            size = o.get("parameters", {}).get("binary_data_size")
            if size is not None:
                out[o["name"]] = (o["datatype"], message[pos:pos + size])
                pos += size
            elif "data" in o:
                out[o["name"]] = (o["datatype"], _raw(o["datatype"], o["data"]))
        return out

    @staticmethod
    def response_kind(message: bytes) -> tuple[bool, bool]:
        """An event of generate_stream: a response; END or an error ends the request."""
        if message == END or message.startswith(ERROR_BODY):
            return True, False
        return False, True

    @staticmethod
    def text_output(message: bytes) -> bytes:
        """A generate event's `text_output` (a string, or a list of them), for a tokenizer."""
        text = json.loads(message).get("text_output", "")
        return ("".join(text) if isinstance(text, list) else str(text)).encode()

    def cork(self) -> Any:
        return None  # one connection per request: nothing to coalesce

    def uncork(self, token: Any) -> None:
        pass

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns.clear()


def _raw(datatype: str, data: list[Any]) -> bytes:
    """JSON output data as the raw bytes validation compares."""
    if datatype == "BYTES":
        items = [x.encode() if isinstance(x, str) else bytes(x) for x in data]
        return b"".join(len(x).to_bytes(4, "little") + x for x in items)
    return np.asarray(data, dtype=DTYPES[datatype]).tobytes()


def _ssl_context(target: TargetSpec) -> ssl.SSLContext | None:
    tls = target.tls
    ctx = ssl.create_default_context(
        cafile=str(tls.root_certs) if tls and tls.root_certs else None)
    if tls and tls.client_cert and tls.client_key:
        ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
