"""YAML from outside (a recipe), read strictly: a key given twice in one mapping is refused with its line (PyYAML keeps
the last, so `quants:` written twice built only the second list), and anchors may not expand a document beyond
:data:`MAX_NODES` nodes (a few aliases of aliases make an exponential document that every later walk pays for).
PyYAML is imported on first use: the device commands import the recipe package but read no recipe."""

from __future__ import annotations

import functools

MAX_NODES = 100_000  # the largest recipe in recipes/ has about 300


class YAMLInputError(ValueError):
    """Why a YAML text is refused: ``line`` (1-based, or None) and ``message``."""

    def __init__(self, line: int | None, message: str):
        self.line, self.message = line, message
        super().__init__(message if line is None else f"line {line}: {message}")


@functools.cache
def _loader_class():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<: *base`: keys written beside it override the merged ones, as YAML says
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise YAMLInputError(line, f"duplicate key {key!r} (first given on line {seen[key]})")
                        seen[key] = line
                    except TypeError:
                        continue  # an unhashable key: SafeLoader refuses it below, with its line
            return super().construct_mapping(node, deep=deep)

    StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)
    return StrictLoader


def _expanded_size(root) -> int:
    """Nodes the document has once every alias is expanded, counted without expanding (each node once, memoized);
    YAMLInputError above :data:`MAX_NODES` or on an alias inside its own anchor."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise YAMLInputError(node.start_mark.line + 1, "an alias refers to the anchor it is inside (recursive)")
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(c) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            n = 1
        open_nodes.discard(key)
        if n > MAX_NODES:
            raise YAMLInputError(node.start_mark.line + 1, f"expands to more than {MAX_NODES} nodes (anchors and "
                                                           "aliases): write the values out")
        sizes[key] = n
        return n

    return size(root)


def load(text: str):
    """The document of ``text``; :class:`YAMLInputError` for duplicate keys, runaway anchors and nesting too deep,
    ``yaml.YAMLError`` for malformed YAML."""
    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except RecursionError:
        raise YAMLInputError(None, "nested too deeply") from None
    finally:
        loader.dispose()
