"""Parse YAML while remembering the line of every key and list item, so errors can point at them."""

from __future__ import annotations

from typing import Any

import yaml


class LineMap(dict[Any, Any]):
    """A YAML mapping that knows the line of each of its keys."""

    def __init__(self) -> None:
        super().__init__()
        self.line: int = 0
        self.key_lines: dict[Any, int] = {}
        self.duplicate_keys: list[tuple[Any, int]] = []


class LineList(list[Any]):
    """A YAML sequence that knows the line of each of its items."""

    def __init__(self) -> None:
        super().__init__()
        self.line: int = 0
        self.item_lines: list[int] = []


# libyaml's parser where PyYAML has it: the pure-Python one took a minute for an inventory of
# 1 MiB. Its composer recurses in C, so a document's nesting is measured first, on its events
# (a flat stream), and a deep one is refused before it is composed.
_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_BASE):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    mapping = LineMap()
    mapping.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping:
            # Plain YAML keeps the last value silently; a repeated key is almost always a mistake.
            mapping.duplicate_keys.append((key, line))
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[key] = line
    return mapping


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    items = LineList()
    items.line = node.start_mark.line + 1
    for child in node.value:
        items.append(loader.construct_object(child, deep=True))
        items.item_lines.append(child.start_mark.line + 1)
    return items


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


class YamlSyntaxError(ValueError):
    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


DEPTH_CAP = 32  # levels of nested mappings and lists; an inventory nests about 5 deep
VALUES_CAP = 200_000  # values a document holds with its aliases expanded (*name counts again)


def parse(text: str) -> Any:
    """Parse one YAML document into plain values, with LineMap / LineList for collections.
    A document nested deeper than DEPTH_CAP, or holding more than VALUES_CAP values once its
    aliases are expanded (a "billion laughs"), or one that contains itself, is refused."""
    try:
        if _too_deep(text):
            raise YamlSyntaxError(None, f"nested deeper than {DEPTH_CAP} levels")
        document = yaml.load(text, Loader=_LineLoader)
    except RecursionError as exc:  # PyYAML's composer recurses once per level
        raise YamlSyntaxError(None, f"nested deeper than {DEPTH_CAP} levels") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return_message = " ".join(part for part in (exc.context, exc.problem) if part)
        if "nesting depth" in return_message:  # libyaml's own limit, met while scanning ahead
            return_message = f"nested deeper than {DEPTH_CAP} levels"
        raise YamlSyntaxError(line, f"not valid YAML: {return_message}") from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(None, f"not valid YAML: {exc}") from exc
    problem = _shape_problem(document)
    if problem:
        raise YamlSyntaxError(None, problem)
    return document


def _too_deep(text: str) -> bool:
    """Whether the document's mappings and lists nest deeper than DEPTH_CAP, from its events."""
    depth = 0
    for event in yaml.parse(text, Loader=_BASE):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > DEPTH_CAP:
                return True
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return False


def _children(node: dict[Any, Any] | list[Any]) -> list[Any]:
    return list(node.values()) if isinstance(node, dict) else node


def _shape_problem(document: Any) -> str | None:
    """What is wrong with the document's size or nesting, measured without expanding it: each
    mapping or list once (an alias is the same object again), its expanded count summed."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values once expanded, depth)
    started: set[int] = set()
    pending: list[tuple[Any, bool]] = [(document, False)]
    while pending:
        node, children_done = pending.pop()
        if not isinstance(node, dict | list) or (id(node) in measured and not children_done):
            continue
        inner = [child for child in _children(node) if isinstance(child, dict | list)]
        if children_done:
            count = 1 + len(node) - len(inner) + sum(measured[id(c)][0] for c in inner)
            depth = 1 + max((measured[id(c)][1] for c in inner), default=0)
            if depth > DEPTH_CAP:
                return f"nested deeper than {DEPTH_CAP} levels"
            if count > VALUES_CAP:
                return (f"holds more than {VALUES_CAP} values once its aliases (*name) are "
                        "expanded: is it an inventory?")  # fmt: skip
            measured[id(node)] = (count, depth)
            continue
        if id(node) in started:
            return "a mapping or list that contains itself (through an alias)"
        started.add(id(node))
        pending.append((node, True))
        pending.extend((child, False) for child in inner)
    return None
