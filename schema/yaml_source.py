"""Safe, bounded YAML that remembers where every key and value sits.

PyYAML composes the document into nodes (which carry marks); this module builds the plain
Python data from those nodes itself, so it can record positions, reject duplicate keys and
bound alias expansion, which `yaml.safe_load` does none of.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml

from .errors import ManifestError

MAX_BYTES = 1 << 20
# A manifest has well under a hundred nodes. The bounds stop alias bombs ("billion laughs").
MAX_NODES = 5_000
MAX_ALIAS_EXPANSIONS = 100
MAX_DEPTH = 32

Path = tuple[str | int, ...]
Mark = tuple[int, int]  # 1-based line and column

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_SCALAR_TAGS = {"tag:yaml.org,2002:str", _INT, "tag:yaml.org,2002:float", _BOOL, "tag:yaml.org,2002:null"}


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and decimal integers.

    YAML 1.1 reads `no` as false, `0777` as octal and `1:20` as 80; in a manifest those are
    surprises. Here only true/false are booleans, and timestamps stay strings.
    """

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT, _TIMESTAMP)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


@dataclass(frozen=True, slots=True)
class YamlDocument:
    data: Any
    keys: dict[Path, Mark]  # where each mapping key is written
    values: dict[Path, Mark]  # where each value starts; () is the document


def read_yaml(text: str, filename: str) -> YamlDocument:
    """Parse one YAML document; any problem raises ManifestError naming its line and column."""
    try:
        root = _compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        opened = exc.context_mark
        if exc.problem and exc.context and opened is not None:  # where the unclosed thing began
            problem = f"{exc.context} (line {opened.line + 1}, column {opened.column + 1}): {problem}"
        raise ManifestError.at(filename, mark.line + 1, mark.column + 1, f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        line, column = _line_column(text, exc.position)
        raise ManifestError.at(
            filename, line, column, f"invalid YAML: {exc.reason} {exc.character!r}"
        ) from None
    except RecursionError:
        raise ManifestError.at(filename, 1, 1, "invalid YAML: nested too deeply") from None
    if root is None:
        raise ManifestError.at(filename, 1, 1, "the manifest is empty")
    return _Builder(filename).document(root)


def _compose(text: str) -> yaml.Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _line_column(text: str, position: int) -> Mark:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _mark(node: yaml.Node) -> Mark:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.keys: dict[Path, Mark] = {}
        self.values: dict[Path, Mark] = {}
        self.nodes = 0
        self.expansions = 0
        self.seen: set[int] = set()
        self.open: set[int] = set()  # nodes being built, to catch an alias that contains itself
        self.constructor = yaml.constructor.SafeConstructor()

    def document(self, root: yaml.Node) -> YamlDocument:
        return YamlDocument(self.build(root, (), _mark(root)), self.keys, self.values)

    def fail(self, node: yaml.Node, message: str) -> ManifestError:
        return ManifestError.at(self.filename, *_mark(node), message)

    def build(self, node: yaml.Node, path: Path, site: Mark) -> Any:
        """`site`: where the innermost node written in place (not reached through an alias) starts."""
        if len(path) > MAX_DEPTH:
            raise self.fail(node, f"nested deeper than {MAX_DEPTH} levels")
        site = self._count(node, site)
        self.values.setdefault(path, _mark(node))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode) and node.tag == "tag:yaml.org,2002:seq":
                return [self.build(item, (*path, i), site) for i, item in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode) and node.tag == "tag:yaml.org,2002:map":
                return self._mapping(node, path, site)
            raise self.fail(node, f"tag {node.tag!r} is not allowed in a manifest")
        finally:
            self.open.discard(id(node))

    def _count(self, node: yaml.Node, site: Mark) -> Mark:
        # Composed aliases share their anchor's node object: meeting a node twice is an expansion.
        if id(node) in self.open:
            raise self.fail(node, "an alias refers to a node that contains it")
        if id(node) in self.seen:
            self.expansions += 1
        else:
            site = _mark(node)
        self.seen.add(id(node))
        self.nodes += 1
        if self.expansions > MAX_ALIAS_EXPANSIONS or self.nodes > MAX_NODES:
            raise ManifestError.at(
                self.filename,
                *site,
                f"aliases expand past {MAX_ALIAS_EXPANSIONS} uses or {MAX_NODES} values; "
                "a manifest needs far fewer (refusing a possible alias bomb)",
            )
        return site

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        if node.tag not in _SCALAR_TAGS:
            raise self.fail(node, f"tag {node.tag!r} is not allowed in a manifest")
        try:
            return self.constructor.construct_object(node)
        except (ValueError, yaml.YAMLError) as exc:  # e.g. an integer too long to convert
            raise self.fail(node, f"cannot read value: {exc}") from None

    def _mapping(self, node: yaml.MappingNode, path: Path, site: Mark) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.fail(key_node, "merge keys ('<<') are not supported in a manifest")
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:str"):
                raise self.fail(key_node, "a key must be a plain string")
            self._count(key_node, site)
            key = key_node.value
            key_path = (*path, key)
            if key in result:
                first_line = self.keys[key_path][0]
                raise self.fail(key_node, f"duplicate key {key!r} (first given on line {first_line})")
            self.keys[key_path] = _mark(key_node)
            result[key] = self.build(value_node, key_path, site)
        return result
