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


class _LineLoader(yaml.SafeLoader):
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


def parse(text: str) -> Any:
    """Parse one YAML document into plain values, with LineMap / LineList for collections."""
    try:
        return yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return_message = " ".join(part for part in (exc.context, exc.problem) if part)
        raise YamlSyntaxError(line, f"not valid YAML: {return_message}") from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(None, f"not valid YAML: {exc}") from exc
