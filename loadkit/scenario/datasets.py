"""Data sets of distinct requests, read as the files users already have.

- perf_analyzer's `--input-data` JSON: `{"data": [{"IN": [..], "IN2": {"content": [..],
  "shape": [..]}, "IN3": {"b64": "..."}}, ...]}`, read as it is; in its sequence form
  (`{"data": [[step, step], [step, step, step]]}`) each inner list is one sequence, whose
  lengths `sequence_lengths` returns (a sequence template walks each one in order);
- JSON Lines: one entry (the same object form) per line; a line that is a bare string is the
  value of the template's only data set input (a prompt file);
- `.npz` (one array per input) or `.npy` (the template's only data set input), whose first
  axis indexes the entries;
- a directory with one file per input: `NAME.npy` (first axis = entries) or `NAME` (raw
  row-major bytes of one batch-1 request, perf_analyzer's directory form).

Every entry is one batch-1 request's inputs, converted to the template's dtype and checked
here, so a bad file is refused before any load with the entry and input that is wrong.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

from loadkit.errors import DatasetError
from loadkit.scenario.model import DTYPES, InputSpec


def size_text(n: float) -> str:
    """4.2 MiB, 3.0 KiB, 12 bytes."""
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n:.0f} bytes"


def file_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def read_dataset(path: Path, inputs: list[InputSpec], max_bytes: int) -> list[dict[str, Any]]:
    """The entries of a data set: one {input name: array} per batch-1 request, for `inputs`
    (the template's `data: dataset` inputs)."""
    size = file_size(path)
    if size > max_bytes:
        raise DatasetError(
            f"{path.name} is {size_text(size)}, above the limit of {size_text(max_bytes)} "
            "(raise it with dataset: {max_size: ...}; every process that sends holds the "
            "prepared requests in memory)")
    raw = _raw_entries(path, inputs)
    if not raw:
        raise DatasetError(f"{path.name} has no entries")
    return [_entry(i, e, inputs, path.suffix) for i, e in enumerate(raw)]


def dataset_names(path: Path) -> list[str]:
    """The input names a data set gives values for, read from the file itself (for a template
    that takes its inputs from the model); [] when the file holds one unnamed input (a .npy,
    or JSON Lines of bare values)."""
    if path.is_dir():
        return sorted({p.name.removesuffix(".npy") for p in path.iterdir() if p.is_file()})
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return []
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as loaded:
            return list(loaded.files)
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        first = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DatasetError(f"{path.name}:{n}: not JSON ({exc.msg} at column "
                                           f"{exc.colno})") from None
                    return [str(k) for k in first] if isinstance(first, dict) else []
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path.name}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not data:
        raise DatasetError(f"{path.name}: expected perf_analyzer's form "
                           '{"data": [{"INPUT": [...]}, ...]}')
    first = data[0][0] if isinstance(data[0], list) and data[0] else data[0]
    if not isinstance(first, dict):
        raise DatasetError(f"{path.name}: data[0]: expected an object of input name -> data")
    return [str(k) for k in first]


def _raw_entries(path: Path, inputs: list[InputSpec]) -> list[Any]:
    names = [s.name for s in inputs]
    if path.is_dir():
        return _directory(path, names)
    suffix = path.suffix.lower()
    if suffix in (".npz", ".npy"):
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"cannot read {path.name} as numpy data: {exc}") from None
        if suffix == ".npy":
            if len(names) != 1:
                raise DatasetError(f"{path.name} is one array, for one input; the template "
                                   f"takes {', '.join(names)} from it (use .npz)")
            arrays = {names[0]: loaded}
        else:
            arrays = {k: loaded[k] for k in loaded.files}
        return _columns(path.name, arrays, names)
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path.name}:{n}: not JSON ({exc.msg} at column "
                                   f"{exc.colno})") from None
            if not isinstance(value, dict):
                if len(names) != 1:
                    raise DatasetError(f"{path.name}:{n}: expected an object with inputs "
                                       f"{', '.join(names)}; found {type(value).__name__}")
                value = {names[0]: value}
            out.append(value)
        return out
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path.name}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DatasetError(f"{path.name}: expected perf_analyzer's form "
                           '{"data": [{"INPUT": [...]}, ...]}')
    flat: list[Any] = []
    for item in doc["data"]:
        flat.extend(item if isinstance(item, list) else [item])  # a sequence's steps, in order
    return flat


def sequence_lengths(path: Path) -> tuple[int, ...]:
    """The lengths of a perf_analyzer JSON data set's sequences (its inner lists; a bare entry
    beside them is a sequence of one step), in order; () for a flat data set or another form."""
    if path.is_dir() or path.suffix.lower() != ".json":
        return ()
    doc = json.loads(path.read_text(encoding="utf-8"))
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not any(isinstance(item, list) for item in data):
        return ()
    for i, item in enumerate(data):
        if item == []:
            raise DatasetError(f"data[{i}] is an empty sequence; expected a list of steps")
    return tuple(len(item) if isinstance(item, list) else 1 for item in data)


def read_expected(path: Path, count: int) -> list[dict[str, Any]]:
    """perf_analyzer's `validation_data`: one {output name: values} per data entry."""
    if path.suffix.lower() != ".json":
        raise DatasetError(f"{path.name}: expected outputs come from a JSON data set's "
                           "'validation_data' (perf_analyzer's form)")
    doc = json.loads(path.read_text(encoding="utf-8"))
    raw = doc.get("validation_data") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise DatasetError(f"{path.name} has no 'validation_data' list to validate against")
    flat: list[Any] = []
    for item in raw:
        flat.extend(item if isinstance(item, list) else [item])
    if len(flat) != count:
        raise DatasetError(f"{path.name}: {len(flat)} validation_data entries for {count} data "
                           "entries; expected one each")
    out = []
    for i, e in enumerate(flat):
        if not isinstance(e, dict) or not e:
            raise DatasetError(f"validation_data[{i}]: expected an object of output name -> "
                               "values")
        entry = {}
        for name, value in e.items():
            if isinstance(value, dict):
                value = value.get("content", [])
            arr = np.array(value, dtype=object).ravel()
            entry[str(name)] = arr if any(isinstance(x, str) for x in arr) else \
                np.array(value, dtype=np.float64).ravel()
        out.append(entry)
    return out


def _columns(name: str, arrays: dict[str, np.ndarray], names: list[str]) -> list[Any]:
    missing = [n for n in names if n not in arrays]
    if missing:
        raise DatasetError(f"{name} has no array for input {', '.join(missing)} "
                           f"(has: {', '.join(arrays)})")
    counts = {n: len(arrays[n]) for n in names}
    if len(set(counts.values())) != 1:
        raise DatasetError(f"{name}: the inputs have different numbers of entries: {counts}")
    return [{n: arrays[n][i] for n in names} for i in range(next(iter(counts.values())))]


def _directory(path: Path, names: list[str]) -> list[Any]:
    arrays: dict[str, Any] = {}
    for n in names:
        npy, raw = path / f"{n}.npy", path / n
        if npy.is_file():
            arrays[n] = np.load(npy, allow_pickle=False)
        elif raw.is_file():
            arrays[n] = [{"raw": raw.read_bytes()}]  # one batch-1 request
        else:
            raise DatasetError(f"{path.name}/ has no file {n} or {n}.npy for input {n}")
    return _columns(path.name + "/", arrays, names)


def _entry(index: int, raw: Any, inputs: list[InputSpec], suffix: str) -> dict[str, Any]:
    where = f"entry {index + 1}" if suffix != ".json" else f"data[{index}]"
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: expected an object of input name -> data; found "
                           f"{type(raw).__name__}")
    out = {}
    for spec in inputs:
        if spec.name not in raw:
            raise DatasetError(f"{where}: input '{spec.name}' is missing (has: "
                               f"{', '.join(map(str, raw)) or 'nothing'})")
        try:
            out[spec.name] = to_array(raw[spec.name], spec)
        except (ValueError, TypeError) as exc:
            raise DatasetError(f"{where}: input '{spec.name}': {exc}") from None
    return out


def to_array(value: Any, spec: InputSpec) -> np.ndarray:
    """One input of one entry as an array of the spec's dtype and shape (a batch-1 request,
    without the batch dimension)."""
    shape: tuple[int, ...] | None = None
    if isinstance(value, dict) and "raw" in value:  # a directory's raw file
        arr = _from_bytes(value["raw"], spec)
    elif isinstance(value, dict):
        if "shape" in value:
            shape = tuple(int(d) for d in value["shape"])
        if "b64" in value:
            arr = _from_bytes(base64.b64decode(value["b64"]), spec)
        elif "content" in value:
            arr = _from_list(value["content"], spec)
        else:
            raise ValueError("expected 'content' or 'b64'")
    elif isinstance(value, np.ndarray):
        arr = value.astype(object) if spec.dtype == "BYTES" else value
        if spec.dtype == "BYTES":
            arr = np.vectorize(_as_bytes, otypes=[object])(arr)
    else:
        arr = _from_list(value, spec)
    if shape is None and spec.shape is not None and -1 not in spec.shape and \
            arr.size == int(np.prod(spec.shape)) and arr.shape != spec.shape:
        shape = spec.shape  # flat content, as perf_analyzer writes it
    if shape is not None:
        if int(np.prod(shape)) != arr.size:
            raise ValueError(f"{arr.size} values do not fill shape {list(shape)}")
        arr = arr.reshape(shape)
    if spec.shape is not None and (len(arr.shape) != len(spec.shape) or any(
            d not in (-1, s) for d, s in zip(spec.shape, arr.shape, strict=False))):
        raise ValueError(f"shape {list(arr.shape)} does not match the template's "
                         f"{list(spec.shape)}")
    return arr


def _as_bytes(x: Any) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode("utf-8")


def _from_list(value: Any, spec: InputSpec) -> np.ndarray:
    if spec.dtype == "BYTES":
        if isinstance(value, (str, bytes)):
            value = [value]
        arr = np.array(value, dtype=object)
        bad = [x for x in arr.ravel() if not isinstance(x, (str, bytes))]
        if bad:
            raise ValueError(f"expected strings (BYTES); found {bad[0]!r}")
        return np.vectorize(_as_bytes, otypes=[object])(arr) if arr.size else arr
    if isinstance(value, (int, float, bool)):
        value = [value]
    flat = np.array(value, dtype=object).ravel()
    bad = [x for x in flat if not isinstance(x, (int, float, bool))]
    if bad:
        raise ValueError(f"expected numbers ({spec.dtype}); found {bad[0]!r}")
    return np.array(value, dtype=DTYPES[spec.dtype])


def _from_bytes(data: bytes, spec: InputSpec) -> np.ndarray:
    if spec.dtype == "BYTES":
        return np.array([data], dtype=object)
    dtype = np.dtype(DTYPES[spec.dtype])
    if len(data) % dtype.itemsize:
        raise ValueError(f"{len(data)} bytes are not a whole number of {spec.dtype} values")
    return np.frombuffer(data, dtype=dtype).copy()
