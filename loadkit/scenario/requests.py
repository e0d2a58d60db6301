"""The request templates, their inputs, the target and the mix."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from loadkit.errors import suggest
from loadkit.scenario.checks import Checker, found
from loadkit.scenario.datasets import (
    DatasetError,
    dataset_names,
    read_dataset,
    read_expected,
    sequence_lengths,
    size_text,
)
from loadkit.scenario.llm import llm_request
from loadkit.scenario.model import (
    DATA_KINDS,
    DATASET_MAX_BYTES,
    DTYPE_ALIASES,
    DTYPES,
    MAX_POOL,
    ORDERS,
    DatasetSpec,
    InputSpec,
    RequestTemplate,
)
from loadkit.scenario.sequences import sequence_spec
from loadkit.scenario.source import KeyPath


def _inputs(ck: Checker, raw: Any, path: KeyPath, partial: bool = False
            ) -> tuple[InputSpec, ...]:
    """The template's inputs. `partial`: the template is completed from the model's metadata
    later (scenario/from_model.py), so an input may leave out its dtype and shape."""
    if not isinstance(raw, dict) or not raw:
        ck.add(
            path, f"expected a mapping of input name -> {{dtype, shape, data}}; found {found(raw)}"
        )
        return ()
    out = []
    for name, spec in raw.items():
        p = (*path, name)
        m = ck.mapping(spec, p, ("dtype", "shape", "shapes", "data", "value", "seed", "file",
                                 "length"), () if partial else ("dtype",))
        if m is None:
            continue
        if partial and "dtype" not in m:
            m = {**m, "dtype": "BYTES" if isinstance(m.get("value"), str) else "FP32"}
            if "shape" not in m and "shapes" not in m:
                m["shape"] = [1]  # a stand-in for the offline checks; the model's comes later
        dtype = m.get("dtype")
        dtype = DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if dtype is not None and dtype not in DTYPES:
            ck.add((*p, "dtype"), f"expected one of {', '.join(DTYPES)} (or STRING); "
                                  f"found {dtype!r}")
            dtype = None
        data = m.get("data", "random")
        if data not in DATA_KINDS:
            ck.add((*p, "data"), f"expected one of {', '.join(DATA_KINDS)}; found {data!r}")
            continue
        if dtype == "BYTES" and data not in ("random", "constant", "dataset"):
            ck.add((*p, "data"), f"expected random, constant or dataset for a BYTES input; "
                                 f"found {data!r}")
            continue
        shape, shapes = _shape(ck, m, p, data)
        value: Any = 0
        if data == "constant":
            if "value" not in m:
                ck.add(p, "data: constant needs a 'value'")
            elif dtype == "BYTES" and not isinstance(m["value"], str):
                ck.add((*p, "value"), f"expected a string (BYTES); found {found(m['value'])}")
            elif dtype != "BYTES" and (not isinstance(m["value"], (int, float)) or
                                       isinstance(m["value"], bool) and dtype != "BOOL"):
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
        length = (16, 16)
        if "length" in m:
            if dtype != "BYTES" or data != "random":
                ck.add((*p, "length"), "'length' only goes with a BYTES input of data: random")
            else:
                length = _length(ck, m["length"], (*p, "length")) or length
        file = None
        if data == "file":
            if "file" not in m:
                ck.add(p, "data: file needs a 'file' (a .npy path relative to the scenario)")
            else:
                file = ck.file(m["file"], (*p, "file"))
        elif "file" in m:
            ck.add((*p, "file"), f"'file' only goes with data: file (data is {data})")
        if dtype is None or (shape is None and not shapes and data != "dataset"):
            continue
        spec_out = InputSpec(name=str(name), dtype=dtype, shape=shape, data=data, value=value,
                             seed=seed, file=file, length=length, shapes=shapes)
        if file is not None:
            _check_npy(ck, spec_out, (*p, "file"))
        out.append(spec_out)
    return tuple(out)


def _shape(ck: Checker, m: dict[str, Any], p: KeyPath, data: str) -> tuple[
        tuple[int, ...] | None, tuple[tuple[tuple[int, ...], float], ...]]:
    """`shape: [3, 224]` (a data set input may leave it out, or say -1 where entries vary), or
    `shapes: [{shape: [16], weight: 50}, ...]`: the template's pool mixes them by weight."""
    expected = "a list of positive integers such as [3, 224, 224]"
    if "shape" in m and "shapes" in m:
        ck.add((*p, "shapes"), "give 'shape' or 'shapes', not both")
        return None, ()
    if "shapes" in m:
        raw = m["shapes"]
        if data == "dataset" or not isinstance(raw, list) or not raw:
            ck.add((*p, "shapes"), "expected a list of {shape: [...], weight: N} (not for data: "
                                   f"dataset inputs); found {found(raw)}")
            return None, ()
        out = []
        for i, item in enumerate(raw):
            q = (*p, "shapes", i)
            im = ck.mapping(item, q, ("shape", "weight"), ("shape",))
            if im is None:
                continue
            dims = im.get("shape")
            if not _dims_ok(dims, False):
                ck.add((*q, "shape"), f"expected {expected}; found {dims!r}")
                continue
            weight = ck.number(im.get("weight", 1), (*q, "weight"), 0, exclusive=True)
            if weight is not None:
                out.append((tuple(dims), weight))
        return None, tuple(out)
    if "shape" not in m:
        if data != "dataset":
            ck.add(p, "missing required key 'shape'")
        return None, ()
    shape = m["shape"]
    if not _dims_ok(shape, data == "dataset"):
        ck.add((*p, "shape"), f"expected {expected}; found {shape!r}")
        return None, ()
    return tuple(shape), ()


def _dims_ok(dims: Any, variable: bool) -> bool:
    return isinstance(dims, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and (d >= 1 or (variable and d == -1))
        for d in dims)


def _length(ck: Checker, raw: Any, path: KeyPath) -> tuple[int, int] | None:
    """`length: 32` or `length: [8, 64]` (each string's length drawn in the range)."""
    if isinstance(raw, list) and len(raw) == 2:
        lo = ck.integer(raw[0], path, 0)
        hi = ck.integer(raw[1], path, 0)
        if lo is None or hi is None:
            return None
        if hi < lo:
            ck.add(path, f"expected [min, max] with min <= max; found {raw}")
            return None
        return lo, hi
    n = ck.integer(raw, path, 0)
    return None if n is None else (n, n)


def _check_npy(ck: Checker, spec: InputSpec, path: KeyPath) -> None:
    assert spec.file is not None
    try:
        arr = np.load(spec.file, allow_pickle=False)
    except (OSError, ValueError) as exc:
        ck.add(path, f"cannot read {spec.file.name} as a .npy array: {exc}")
        return
    if spec.shape is None:
        return
    if tuple(arr.shape) != spec.shape and tuple(arr.shape[1:]) != spec.shape:
        ck.add(
            path,
            f"{spec.file.name} has shape {list(arr.shape)}; expected {list(spec.shape)} "
            f"or [batch, {', '.join(map(str, spec.shape))}]",
        )


def _template(ck: Checker, name: str, raw: Any, path: KeyPath) -> RequestTemplate | None:
    m = ck.mapping(
        raw, path, ("model", "version", "batch_size", "inputs", "outputs", "dataset", "pool",
                    "order", "parameters", "sequence", "composing_models", "validate", "llm",
                    "cancel", "endpoint"),
        ("model",)
    )
    if m is None:
        return None
    if "llm" in m:
        return llm_request(ck, name, m, path, ck.choice(m, "order", path, ORDERS, "sequential"),
                           _parameters(ck, m.get("parameters"), (*path, "parameters")))
    if from_model(m):
        return _pending(ck, name, m, path)
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
    dataset = _dataset(ck, m, path, inputs)
    validate = ck.boolean(m, "validate", path, False)
    if validate and dataset is None and "dataset" not in m:
        ck.add((*path, "validate"), "validate: true compares responses with a data set's "
                                    "validation_data; expected a 'dataset'")
    elif validate and dataset is not None:
        try:
            expected = read_expected(dataset.file, len(dataset.entries))
        except DatasetError as exc:
            ck.add((*path, "validate"), str(exc))
        else:
            dataset = dataclasses.replace(dataset, expected=tuple(expected))
    pool = 1
    if "pool" in m:
        if dataset is not None:
            ck.add((*path, "pool"), "a template with a dataset takes its pool from the file; "
                                    "expected no 'pool'")
        else:
            pool = ck.integer(m["pool"], (*path, "pool"), 1, MAX_POOL) or 1
    order = ck.choice(m, "order", path, ORDERS, "sequential")
    parameters = _parameters(ck, m.get("parameters"), (*path, "parameters"))
    sequence = (sequence_spec(ck, m["sequence"], (*path, "sequence"),
                          dataset.sequences if dataset is not None else ())
                if "sequence" in m else None)
    if sequence is not None and dataset is not None and dataset.sequences and batch != 1:
        ck.add((*path, "batch_size"), f"each step of {dataset.file.name}'s sequences is one "
                                      f"request; expected batch_size 1, found {batch}")
    composing: tuple[str, ...] = ()
    if "composing_models" in m:
        c = m["composing_models"]
        if not isinstance(c, list) or not c or not all(isinstance(x, str) and x for x in c):
            ck.add((*path, "composing_models"), f"expected a list of model names (the models "
                                                f"a BLS model calls); found {found(c)}")
        else:
            composing = tuple(c)
    if model is None or batch is None or not inputs:
        return None
    template = RequestTemplate(name=name, model=model, batch_size=batch, inputs=inputs,
                               outputs=tuple(outputs), version=version,
                               dataset=dataset, pool=pool, order=order, parameters=parameters,
                               sequence=sequence, composing=composing, validate=validate)
    if dataset is not None and batch and batch > 1:
        _check_batches(ck, (*path, "dataset"), dataset, batch)
    limit = dataset.max_bytes if dataset is not None else DATASET_MAX_BYTES
    if dataset is None and pool * request_bytes(template) > limit:
        ck.add((*path, "pool"), f"{pool} requests of ~{size_text(request_bytes(template))} are "
                                f"above the limit of {size_text(limit)} held in memory")
    return template


def from_model(m: dict[str, Any]) -> bool:
    """A template without `inputs:`, or with an input that leaves out its dtype, takes what
    it leaves out from the model's metadata, as perf_analyzer does."""
    raw = m.get("inputs")
    return "inputs" not in m or isinstance(raw, dict) and any(
        isinstance(v, dict) and "dtype" not in v for v in raw.values())


def _pending(ck: Checker, name: str, m: dict[str, Any], path: KeyPath) -> RequestTemplate | None:
    """A template to be completed from the model's metadata. Offline, what stands without the
    model is checked: its inputs as far as given, that the data set can be read, and the other
    keys (parsed with a stand-in input); the whole template is parsed again, with the model's
    inputs, once the server is asked (scenario/from_model.py)."""
    if "inputs" in m:
        _inputs(ck, m["inputs"], (*path, "inputs"), partial=True)
    if "dataset" in m:
        raw = m["dataset"]
        file = raw.get("file") if isinstance(raw, dict) else raw
        resolved = (ck.base_dir / file).resolve() if isinstance(file, str) else None
        if resolved is None or not resolved.exists():
            ck.add((*path, "dataset"), f"file not found: {file} (resolved to {resolved})")
        else:
            try:
                dataset_names(resolved)
            except (DatasetError, OSError, ValueError) as exc:
                ck.add((*path, "dataset"), f"{file}: {exc}")
    stand_in = {k: v for k, v in m.items() if k not in ("inputs", "dataset", "validate",
                                                         "sequence")}
    checked = Checker(ck.src, ck.base_dir)
    template = _template(checked, name, {**stand_in, "inputs": {"_": {"dtype": "FP32",
                                                                      "shape": [1]}}}, path)
    ck.problems += checked.problems
    if template is None or checked.problems:
        return None
    return dataclasses.replace(template, inputs=(), pending=dict(m))


def _check_batches(ck: Checker, path: KeyPath, dataset: DatasetSpec, batch: int) -> None:
    """A request of batch B takes B consecutive entries: they must share each input's shape."""
    entries = dataset.entries
    for start in range(0, max(1, -(-len(entries) // batch)) * batch, batch):
        rows = [entries[(start + j) % len(entries)] for j in range(batch)]
        for name in rows[0]:
            shapes = {tuple(r[name].shape) for r in rows}
            if len(shapes) > 1:
                ck.add(path, f"{dataset.file.name}: entries {start + 1}..{start + batch} go in "
                             f"one request of batch_size {batch} but input '{name}' has shapes "
                             f"{sorted(map(list, shapes))}; a batch needs one shape")
                return


def request_bytes(t: RequestTemplate) -> int:
    """About how many bytes one generated request of the template takes."""
    total = 0
    for s in t.inputs:
        shape = s.shape or (max(s.shapes, key=lambda x: int(np.prod(x[0])))[0] if s.shapes
                            else (1,))
        n = int(np.prod(shape)) * t.batch_size
        total += n * (4 + s.length[1]) if s.dtype == "BYTES" else \
            n * np.dtype(DTYPES[s.dtype]).itemsize
    return total


def _dataset(ck: Checker, m: dict[str, Any], path: KeyPath,
             inputs: tuple[InputSpec, ...]) -> DatasetSpec | None:
    """`dataset: FILE` or `dataset: {file: FILE, max_size: 1GB}`: read and checked now."""
    wanted = [s for s in inputs if s.data == "dataset"]
    if "dataset" not in m:
        if wanted:
            ck.add((*path, "inputs", wanted[0].name, "data"),
                   "data: dataset needs the template's 'dataset' (a file)")
        return None
    p = (*path, "dataset")
    raw = m["dataset"]
    max_bytes = DATASET_MAX_BYTES
    if isinstance(raw, dict):
        dm = ck.mapping(raw, p, ("file", "max_size"), ("file",))
        if dm is None or "file" not in dm:
            return None
        if "max_size" in dm:
            max_bytes = ck.size(dm["max_size"], (*p, "max_size")) or max_bytes
        raw, p = dm["file"], (*p, "file")
    name = ck.string(raw, p, "a data set file or folder")
    if name is None:
        return None
    file = (ck.base_dir / name).resolve()
    if not file.exists():
        ck.add(p, f"file not found: {name} (resolved to {file})")
        return None
    if not wanted:
        ck.add(p, "no input of the template takes data: dataset")
        return None
    try:
        entries = read_dataset(file, wanted, max_bytes)
        lengths = sequence_lengths(file)
    except DatasetError as exc:
        ck.add(p, f"{name}: {exc}")
        return None
    except (OSError, UnicodeDecodeError) as exc:
        ck.add(p, f"cannot read {name}: {exc}")
        return None
    return DatasetSpec(file=file, max_bytes=max_bytes, entries=tuple(entries), sequences=lengths)


def _parameters(ck: Checker, raw: Any, path: KeyPath) -> tuple[tuple[str, Any], ...]:
    """KServe request parameters: `{priority: 1, timeout: 5000, my_key: "x"}`."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        ck.add(path, f"expected a mapping of parameter -> value; found {found(raw)}")
        return ()
    out = []
    for key, value in raw.items():
        if not isinstance(value, (bool, int, float, str)):
            ck.add((*path, key), f"expected a boolean, number or string; found {found(value)}")
            continue
        out.append((str(key), value))
    return tuple(out)


def _mix(ck: Checker, raw: Any, names: list[str],
         path: KeyPath = ("mix",)) -> dict[str, float]:
    if raw is None:
        return {n: 1.0 for n in names}
    if not isinstance(raw, dict) or not raw:
        ck.add(path, f"expected a mapping of request name -> weight; found {found(raw)}")
        return {}
    out: dict[str, float] = {}
    for name, weight in raw.items():
        if name not in names:
            hint = suggest(name, names)
            ck.add(
                (*path, name),
                f"no request named '{name}' in requests{hint} (have: {', '.join(names)})",
            )
            continue
        w = ck.number(weight, (*path, name), 0, exclusive=False)
        if w is not None:
            out[name] = w
    if out and sum(out.values()) <= 0:
        ck.add(path, "the mix weights sum to 0; expected at least one weight > 0")
    return {k: v for k, v in out.items() if v > 0}

