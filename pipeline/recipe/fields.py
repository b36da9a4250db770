"""The building blocks of the recipe reference (pipeline/recipe/schema.py): a :class:`Field` is one key, a
:class:`Section` one mapping. Standard library only."""

from __future__ import annotations

from typing import Any


class Note(str):
    """A default that depends on the rest of the recipe, described in words."""

    __slots__ = ()


class _Required:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class Field:
    """One key of a section (plain slotted class: NamedTuple and dataclass cost import time)."""

    __slots__ = ("key", "type", "default", "doc", "example")

    def __init__(self, key: str, type: str, default: Any, doc: str, example: Any = None):
        self.key = key  # a key of the mapping; <...> names a key the user chooses (e.g. an eval set's name)
        self.type = type  # as a user reads it
        self.default = default  # plain value, REQUIRED or Note(...)
        self.doc = doc  # one to three sentences
        self.example = example  # a valid value, shown as YAML; None: no example

    @property
    def placeholder(self) -> bool:
        return self.key.startswith("<")

    def __repr__(self) -> str:
        return f"Field({self.key!r})"


class Section:
    """One mapping of a recipe and its fields, in the order the reference shows them."""

    __slots__ = ("path", "title", "intro", "fields")

    def __init__(self, path: str, title: str, intro: str, fields: tuple[Field, ...]):
        self.path = path  # "" for the top level; "quants[]" for each entry of the list `quants`
        self.title = title
        self.intro = intro
        self.fields = fields

    @property
    def keys(self) -> set[str]:
        """The keys the parser allows in this mapping (placeholders excluded)."""
        return {f.key for f in self.fields if not f.placeholder}

    def __repr__(self) -> str:
        return f"Section({self.path!r})"
