"""Model-config overlays: check field names against Triton's own ModelConfig schema, and merge.

The schema is the protobuf descriptor shipped in tritonclient (model_config_pb2), so a misspelt
field is caught before anything reaches the server, with the same names Triton uses in JSON.
"""

from __future__ import annotations

import copy
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from loadkit.errors import suggest

Sub = tuple[str | int, ...]
# Fields an overlay may not change: they define the model's identity and its tensors.
FROZEN_FIELDS = ("name", "input", "output")


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` is deprecated there
    if flag is not None:
        return bool(flag)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _check(value: Any, desc: Descriptor, path: Sub, out: list[tuple[Sub, str]]) -> None:
    if not isinstance(value, dict):
        out.append(
            (path, f"expected a mapping of {desc.name} fields; found {type(value).__name__}")
        )
        return
    names = [f.name for f in desc.fields]
    for key, sub in value.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            hint = suggest(key, names)
            out.append(((*path, key), f"unknown {desc.name} field '{key}'{hint}"))
            continue
        _check_field(sub, field, (*path, key), out)


def _check_field(value: Any, field: FieldDescriptor, path: Sub, out: list[tuple[Sub, str]]) -> None:
    if _is_map(field):
        if not isinstance(value, dict):
            out.append(
                (path, f"expected a mapping for '{field.name}'; found {type(value).__name__}")
            )
            return
        value_field = field.message_type.fields_by_name["value"]
        for k, v in value.items():
            if value_field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(
                v, (str, int, float)
            ):
                continue  # shorthand: parameters {key: "value"} means {string_value: "value"}
            _check_field(v, value_field, (*path, k), out)
        return
    if _is_repeated(field):
        if not isinstance(value, list):
            out.append((path, f"expected a list for '{field.name}'; found {type(value).__name__}"))
            return
        for i, item in enumerate(value):
            _check_single(item, field, (*path, i), out)
        return
    _check_single(value, field, path, out)


def _check_single(
    value: Any, field: FieldDescriptor, path: Sub, out: list[tuple[Sub, str]]
) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        _check(value, field.message_type, path, out)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values]
        if value not in names:
            out.append((path, f"expected one of {', '.join(names)}; found {value!r}"))
    elif field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            out.append((path, f"expected true or false; found {value!r}"))
    elif field.type == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            out.append((path, f"expected a string; found {value!r}"))
    elif field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            out.append((path, f"expected a number; found {value!r}"))
    elif (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < 0
        and "uint" in str(field.type)
    ):
        out.append((path, f"expected an integer; found {value!r}"))


def check_overlay(overlay: Any) -> list[tuple[Sub, str]]:
    """Every unknown or mistyped field of an overlay, as (sub-path, message)."""
    out: list[tuple[Sub, str]] = []
    _check(overlay, model_config_pb2.ModelConfig.DESCRIPTOR, (), out)
    if isinstance(overlay, dict):
        for name in FROZEN_FIELDS:
            if name in overlay:
                out.append(((name,), f"'{name}' cannot be changed by an overlay"))
    return out


def normalize(overlay: dict[str, Any]) -> dict[str, Any]:
    """Expand shorthands: parameters {k: "v"} -> {k: {string_value: "v"}}."""
    out = copy.deepcopy(overlay)
    params = out.get("parameters")
    if isinstance(params, dict):
        out["parameters"] = {
            k: v if isinstance(v, dict) else {"string_value": str(v)} for k, v in params.items()
        }
    return out


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Overlay onto a config: mappings merge key by key; lists and scalars are replaced; None
    removes the field (a tune dimension's `dynamic_batching: off`)."""
    out = copy.deepcopy(base)
    for key, value in normalize(overlay).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict) and key != "instance_group":
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def needs_gpu(overlay: dict[str, Any]) -> bool:
    """An overlay that asks for GPU instances or a GPU execution accelerator."""
    groups = overlay.get("instance_group", [])
    if isinstance(groups, list) and any(
        isinstance(g, dict) and g.get("kind") == "KIND_GPU" for g in groups
    ):
        return True
    opt = overlay.get("optimization", {})
    accel = opt.get("execution_accelerators", {}) if isinstance(opt, dict) else {}
    return isinstance(accel, dict) and bool(accel.get("gpu_execution_accelerator"))


def local_problems(config: dict[str, Any]) -> list[str]:
    """Mistakes Triton would catch only at load time (or not at all), caught before sending."""
    problems = []
    mbs = int(config.get("max_batch_size", 0))
    db = config.get("dynamic_batching")
    if isinstance(db, dict):
        if mbs == 0:
            problems.append("dynamic_batching needs max_batch_size > 0")
        for size in db.get("preferred_batch_size", []):
            if mbs and int(size) > mbs:
                problems.append(
                    f"dynamic_batching.preferred_batch_size {size} is above max_batch_size {mbs}"
                )
    for group in config.get("instance_group", []):
        if int(group.get("count", 1)) < 1:
            problems.append(f"instance_group count must be >= 1; found {group.get('count')}")
    return problems


def path_overlay(path: str, value: Any) -> dict[str, Any]:
    """'dynamic_batching.max_queue_delay_microseconds', 100 -> the overlay that sets it; a
    repeated message on the way (instance_group) becomes a one-item list, so check_overlay
    checks the value against the right field."""
    parts = path.split(".")
    desc: Descriptor | None = model_config_pb2.ModelConfig.DESCRIPTOR
    wrap: list[bool] = []
    for part in parts[:-1]:
        field = desc.fields_by_name.get(part) if desc is not None else None
        if field is None or field.type != FieldDescriptor.TYPE_MESSAGE or _is_map(field):
            wrap.append(False)
            desc = None
            continue
        wrap.append(_is_repeated(field))
        desc = field.message_type
    node: Any = value
    for part, repeated in zip(reversed(parts[1:]), reversed(wrap), strict=True):
        node = {part: node}
        if repeated:
            node = [node]
    return {parts[0]: node}


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted field path in a full config in place; through a list (instance_group) the
    rest of the path is set in every item (one item is made if there is none)."""
    node: Any = config
    parts = path.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, list):
            if not node:
                node.append({})
            for item in node:
                set_path(item, ".".join(parts[i:]), value)
            return
        if i == len(parts) - 1:
            node[part] = copy.deepcopy(value)
            return
        wrapped = path_overlay(".".join(parts[i:]), value)[part]
        if part not in node or not isinstance(node[part], (dict, list)):
            node[part] = [] if isinstance(wrapped, list) else {}
        node = node[part]


def to_pbtxt(config: dict[str, Any]) -> str:
    """A config as Triton's JSON gives it -> config.pbtxt text (protobuf text_format)."""
    from google.protobuf import json_format, text_format

    message = json_format.ParseDict(normalize(config), model_config_pb2.ModelConfig(),
                                    ignore_unknown_fields=False)
    return text_format.MessageToString(message)


def from_pbtxt(text: str) -> dict[str, Any]:
    """config.pbtxt text -> the JSON form Triton's model-config API uses."""
    from google.protobuf import json_format, text_format

    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
