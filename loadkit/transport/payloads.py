"""Request bytes: each template's requests are encoded once, at start-up, by the door's encoder
(grpc_door.py, http_door.py), and every call sends them as they are.

A template has a pool of prepared requests: one (the default), `pool: N` generated ones (random
inputs seeded per entry, shapes mixed by weight), or one per group of data set entries (a batch
of B takes B consecutive entries, as perf_analyzer does). The engine draws from the pool in turn
or at random; nothing is serialized on the hot path. BYTES tensors go as Triton reads them:
each element a 4-byte little-endian length, then its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np

from loadkit.scenario import DTYPES, InputSpec, RequestTemplate, mixed_shapes
from loadkit.transport.door import Encoder, Refs, Tensors

ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)


def _random_strings(rng: np.random.Generator, n: int, length: tuple[int, int]) -> np.ndarray:
    out = np.empty(n, dtype=object)
    for i in range(n):
        k = int(rng.integers(length[0], length[1] + 1))
        out[i] = ALPHABET[rng.integers(0, len(ALPHABET), size=k)].tobytes()
    return out


def input_array(spec: InputSpec, batch_size: int, batched: bool = True, entry: int = 0,
                shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The tensor one generated request sends: [batch, *shape] (a model without batching:
    [*shape]), filled as the scenario says; `entry` > 0 varies random data per pool entry."""
    dims = shape if shape is not None else spec.shape
    assert dims is not None
    full = (batch_size, *dims) if batched else dims
    if spec.dtype == "BYTES":
        n = int(np.prod(full))
        if spec.data == "constant":
            arr = np.full(n, str(spec.value).encode("utf-8"), dtype=object)
        else:
            arr = _random_strings(np.random.default_rng([spec.seed, entry]), n, spec.length)
        return arr.reshape(full)
    dtype = np.dtype(DTYPES[spec.dtype])
    if spec.data == "zeros":
        return np.zeros(full, dtype)
    if spec.data == "ones":
        return np.ones(full, dtype)
    if spec.data == "constant":
        return np.full(full, spec.value, dtype)
    if spec.data == "file":
        assert spec.file is not None
        arr = np.load(spec.file, allow_pickle=False).astype(dtype)
        if arr.shape == dims:
            arr = np.broadcast_to(arr, full)
        # [n, *shape] files are cycled to the batch size (a model without batching: first row)
        return np.resize(arr, full)
    rng = np.random.default_rng(spec.seed if entry == 0 else [spec.seed, entry])
    if dtype.kind == "f":
        return rng.random(full).astype(dtype)
    if dtype.kind == "b":
        return rng.random(full) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -128), min(info.max, 127), size=full, dtype=dtype)


def tensor_bytes(arr: np.ndarray, dtype: str) -> bytes:
    """Row-major raw contents as Triton reads them (BYTES: length-prefixed elements)."""
    if dtype == "BYTES":
        return b"".join(struct.pack("<I", len(x)) + x for x in arr.ravel())
    return np.ascontiguousarray(arr, DTYPES[dtype]).tobytes()


def _generated(template: RequestTemplate) -> Iterator[Tensors]:
    n = max(1, template.pool)
    shapes = {s.name: mixed_shapes(s, n) for s in template.inputs if s.shapes}
    for k in range(n):
        yield [(s, input_array(s, template.batch_size, template.batched, k,
                               shapes[s.name][k] if s.shapes else None))
               for s in template.inputs]


def batches(entries: int, batch: int) -> int:
    """How many requests a data set of `entries` makes at `batch` entries each: every entry is
    sent; the last request wraps round to the first entries when the count is not a multiple
    (the plan and the summary say so)."""
    return max(1, -(-entries // batch))


def _from_dataset(template: RequestTemplate) -> Iterator[Tensors]:
    assert template.dataset is not None
    entries = template.dataset.entries
    b = template.batch_size if template.batched else 1
    for g in range(batches(len(entries), b)):
        rows = [entries[(g * b + j) % len(entries)] for j in range(b)]
        tensors: list[tuple[InputSpec, np.ndarray]] = []
        for s in template.inputs:
            if s.data != "dataset":
                tensors.append((s, input_array(s, template.batch_size, template.batched, g)))
                continue
            arrays = [r[s.name] for r in rows]
            if len({a.shape for a in arrays}) > 1:
                raise ValueError(
                    f"entries {g * b + 1}..{g * b + b} of {template.dataset.file.name} go in one "
                    f"batch of {b} but input '{s.name}' has shapes "
                    f"{sorted({a.shape for a in arrays})}: a batch needs one shape")
            arr = np.stack(arrays) if template.batched else arrays[0]
            tensors.append((s, arr))
        yield tensors


def expected_pool(template: RequestTemplate) -> list[dict[str, np.ndarray]] | None:
    """With validate: true, what each request of the pool must get back (a batch's entries
    concatenated, as its outputs are)."""
    if not template.validate or template.dataset is None or not template.dataset.expected:
        return None
    expected = template.dataset.expected
    b = template.batch_size if template.batched else 1
    out = []
    for g in range(batches(len(expected), b)):
        rows = [expected[(g * b + j) % len(expected)] for j in range(b)]
        out.append({name: np.concatenate([r[name] for r in rows]) for name in rows[0]})
    return out


# shared memory (control/shared_memory.py): writes a pool's inputs into regions and gives each
# entry where its inputs are and its outputs go
Place = Callable[[RequestTemplate, list[Tensors]], list[tuple[Refs, Refs]]]


def prepare_pool(template: RequestTemplate, encoder: Encoder,
                 place: Place | None = None) -> list[bytes]:
    """Every request the template sends, encoded once by the door's encoder (door.py); with
    `place`, its tensors in shared memory and the requests naming them."""
    tensors = iter(_from_dataset(template) if template.dataset is not None
                   else _generated(template))
    if place is None:
        return [encoder.encode(template, t) for t in tensors]
    pool = list(tensors)
    return [encoder.encode(template, t, refs_in, refs_out)
            for t, (refs_in, refs_out) in zip(pool, place(template, pool), strict=True)]
