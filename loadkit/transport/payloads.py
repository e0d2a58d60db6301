"""Request bytes: each template's ModelInferRequest is serialized once and reused by every call.

tritonclient's InferInput objects and per-call protobuf serialization cost tens of microseconds;
the engine's methods use identity serializers and send these bytes as they are, and responses
are not parsed beyond spotting an error.
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2

from loadkit.scenario import DTYPES, InputSpec, RequestTemplate


def input_array(spec: InputSpec, batch_size: int, batched: bool = True) -> np.ndarray:
    """The tensor one template sends: [batch, *shape] (a model without batching: [*shape]),
    filled as the scenario says."""
    shape = (batch_size, *spec.shape) if batched else spec.shape
    dtype = np.dtype(DTYPES[spec.dtype])
    if spec.data == "zeros":
        return np.zeros(shape, dtype)
    if spec.data == "ones":
        return np.ones(shape, dtype)
    if spec.data == "constant":
        return np.full(shape, spec.value, dtype)
    if spec.data == "file":
        assert spec.file is not None
        arr = np.load(spec.file, allow_pickle=False).astype(dtype)
        if arr.shape == spec.shape:
            arr = np.broadcast_to(arr, shape)
        # [n, *shape] files are cycled to the batch size (a model without batching: first row)
        return np.resize(arr, shape)
    rng = np.random.default_rng(spec.seed)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -128), min(info.max, 127), size=shape, dtype=dtype)


def prepare(template: RequestTemplate) -> bytes:
    """Serialize one ModelInferRequest for the template (the bytes every call reuses)."""
    req = service_pb2.ModelInferRequest(model_name=template.model, model_version=template.version)
    for spec in template.inputs:
        arr = input_array(spec, template.batch_size, template.batched)
        tensor = req.inputs.add()
        tensor.name = spec.name
        tensor.datatype = spec.dtype
        tensor.shape.extend(arr.shape)
        req.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
    for name in template.outputs:
        req.outputs.add().name = name
    return req.SerializeToString()
