"""YAML with line numbers: PyYAML's safe composer, turned into plain data plus a line map.

We compose nodes with `yaml.SafeLoader` (never a loader that can build objects) and convert them
ourselves, so that every key path keeps the line it came from, duplicate keys are refused, and
alias expansion is bounded (a "billion laughs" file is refused instead of eating memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadkit.errors import Problem, ScenarioError

KeyPath = tuple[str | int, ...]
MAX_NODES = 100_000
MAX_BYTES = 5_000_000


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass
class Source:
    """Parsed YAML: `data` is plain Python; `lines` maps key paths to 1-based line numbers."""

    file: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, path: KeyPath) -> int | None:
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def problem(self, path: KeyPath, message: str) -> Problem:
        return Problem(file=self.file, line=self.line(path), path=format_path(path),
                       message=message)


class _Converter:
    def __init__(self, file: str, loader: yaml.SafeLoader):
        self.file = file
        self.loader = loader
        self.lines: dict[KeyPath, int] = {}
        self.count = 0

    def fail(self, node: yaml.Node, message: str) -> ScenarioError:
        return ScenarioError([Problem(file=self.file, line=node.start_mark.line + 1, path="",
                                      message=message)])

    def convert(self, node: yaml.Node, path: KeyPath) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            # The node itself may be an anchor far above; name the key being expanded.
            line = self.lines.get(path[:1], node.start_mark.line + 1)
            raise ScenarioError(
                [
                    Problem(
                        file=self.file,
                        line=line,
                        path="",
                        message=f"the document expands to more than {MAX_NODES} values "
                        "(anchors, aliases repeated too often); expected a scenario of "
                        "ordinary size",
                    )
                ]
            )
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self.fail(key_node, "merge keys ('<<') are not supported")
                key = self.convert(key_node, path)
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise self.fail(key_node, f"keys must be strings, found {key!r}")
                key = str(key)
                if key in out:
                    raise self.fail(key_node, f"duplicate key '{key}'")
                self.lines[(*path, key)] = key_node.start_mark.line + 1
                out[key] = self.convert(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        # YAML 1.1 reads 2:16:2 as a base-60 integer; a ramp is what people mean.
        if node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and ":" in node.value:
            return node.value
        return self.loader.construct_object(node, deep=True)


def load_yaml(path: Path) -> Source:
    """Parse a scenario file, raising ScenarioError (with file and line) on malformed YAML."""
    file = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(
            [Problem(file=file, line=None, path="", message=f"cannot read file: {exc.strerror}")]
        ) from None
    if len(raw) > MAX_BYTES:
        raise ScenarioError([Problem(file=file, line=None, path="",
                                     message=f"file is over {MAX_BYTES} bytes")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError([Problem(file=file, line=None, path="",
                                     message="not UTF-8 text")]) from None
    return parse_text(text, file)


def parse_text(text: str, file: str = "<text>") -> Source:
    """YAML text as a Source, read as a scenario file is (a ramp such as 2:16:2 stays a ramp,
    never YAML 1.1's base-60 integer 8162)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ScenarioError([Problem(file=file, line=1, path="",
                                         message="the file is empty; expected a scenario")])
        conv = _Converter(file, loader)
        data = conv.convert(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "malformed"
        if exc.context and exc.context_mark is not None and exc.problem:
            what += f" ({exc.context} that starts at line {exc.context_mark.line + 1})"
        raise ScenarioError([Problem(file=file, line=line, path="",
                                     message=f"malformed YAML: {what}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError([Problem(file=file, line=None, path="",
                                     message=f"malformed YAML: {exc}")]) from None
    finally:
        loader.dispose()
    return Source(file, data, conv.lines)
