"""Output validation, only when a template asks for it (`validate: true`): the response is
parsed and each expected output compared with what the server sent. A difference becomes the
request's error, `MISMATCH`, with the first differing element in its message (kept with the
server's other words). Floats compare with a relative tolerance of 1e-5 (absolute 1e-6);
integers, booleans and strings exactly."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from loadkit.scenario import DTYPES
from loadkit.transport.door import Outputs

RTOL, ATOL = 1e-5, 1e-6


def _strings(raw: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4: pos + 4 + n])
        pos += 4 + n
    return out


def mismatch(outputs: Outputs, expected: dict[str, np.ndarray]) -> str | None:
    """Why the response's outputs (as the door read them) differ from `expected` (output
    name -> flat values), or None."""
    for name, want in expected.items():
        if name not in outputs:
            return f"output '{name}' is not in the response (has: {', '.join(outputs) or 'none'})"
        datatype, raw = outputs[name]
        got: Any
        if datatype == "BYTES":
            got = _strings(raw)
            want_list = [w if isinstance(w, bytes) else str(w).encode() for w in want.ravel()]
            bad = next((e for e, (a, b) in enumerate(zip(got, want_list, strict=False))
                        if a != b), None)
            if len(got) != len(want_list):
                return f"output '{name}': {len(got)} elements, expected {len(want_list)}"
            if bad is not None:
                return (f"output '{name}' element {bad}: expected {want_list[bad]!r}, "
                        f"got {got[bad]!r}")
            continue
        got = np.frombuffer(raw, dtype=DTYPES.get(datatype, "float32")).astype(np.float64)
        want_f = want.astype(np.float64).ravel()
        if got.size != want_f.size:
            return f"output '{name}': {got.size} elements, expected {want_f.size}"
        exact = datatype not in ("FP16", "FP32", "FP64")
        same = got == want_f if exact else np.isclose(got, want_f, rtol=RTOL, atol=ATOL)
        if not same.all():
            e = int(np.argmin(same))
            return f"output '{name}' element {e}: expected {want_f[e]:g}, got {got[e]:g}"
    return None
