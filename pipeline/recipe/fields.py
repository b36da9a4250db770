"""The building blocks of the recipe reference (pipeline/recipe/schema.py): a :class:`Field` is one key, a
:class:`Section` one mapping; a numeric field carries its :class:`~pipeline.bounds.Range`, which the parser checks
and the reference shows. Standard library only."""

from __future__ import annotations

from typing import Any

from pipeline.bounds import INT32_MAX, Range, integer


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

    __slots__ = ("key", "type", "default", "doc", "example", "range")

    def __init__(self, key: str, type: str, default: Any, doc: str, example: Any = None,
                 range: Range | dict[str, Range] | None = None):
        self.key = key  # a key of the mapping; <...> names a key the user chooses (e.g. an eval set's name)
        self.type = type  # as a user reads it
        self.default = default  # plain value, REQUIRED or Note(...)
        self.doc = doc  # one to three sentences
        self.example = example  # a valid value, shown as YAML; None: no example
        # a number's range (of each number, for a list of them); a map of numbers (`budget:`): a range per key
        self.range = range

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

    def field(self, key: str) -> Field:
        for f in self.fields:
            if f.key == key:
                return f
        raise KeyError(f"{self.path or 'top level'}: no field {key!r}")

    def __repr__(self) -> str:
        return f"Section({self.path!r})"


# Ranges several sections share. Where llama.cpp sets no bound, ggufpipe's is finite and far above any real use.
GATE_MAX = 1e6  # a perplexity ratio or KLD limit; random-weight test models are gated at up to 1000
MB_MAX = 1e12  # megabytes: an exabyte
TOKEN_ID = integer(0, INT32_MAX, "llama_token is an int32")
N_PREDICT = integer(8, INT32_MAX, "llama.cpp's n_predict is an int32")
DRAFT_LENGTH = integer(1, 64)
PROMPTS = integer(1, 1000)
