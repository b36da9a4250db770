"""Tensor groups of a measured mix (docs/mixes.md): role x band of layers, one type per group.

A quantized tensor ``blk.<i>.<role>.weight`` belongs to the group of its role and of the band holding layer ``i``:
the layers ``0 .. n-1`` cut into ``min(bands, n)`` runs of consecutive layers as equal as integer division makes
them. A mixture of experts' tensors follow the same rule: the routed experts (``ffn_{gate,up,down}_exps``) per
role and band, the shared expert's (``ffn_*_shexp``) groups of their own roles, apart from the experts; routers
(``ffn_gate_inp``) and the 1-D shared-expert gate are never quantized (src/llama-quant.cpp:292, 306), so they are in
no group. A tensor outside the blocks (``token_embd.weight``, ``output.weight``...) is a group of its own. Group
names sort the way the solver breaks ties: ``attn_q.0-4``, ``ffn_down_exps.4-7``, ``token_embd``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight)?$")


@dataclass(frozen=True)
class Group:
    name: str
    role: str
    band: tuple[int, int] | None  # first and last layer; None outside the blocks
    tensors: tuple[str, ...]  # in file order


def bands(n_layers: int, n_bands: int) -> list[tuple[int, int]]:
    """``min(n_bands, n_layers)`` runs of consecutive layers covering ``0 .. n_layers-1``."""
    b = max(1, min(n_bands, n_layers))
    return [(i * n_layers // b, (i + 1) * n_layers // b - 1) for i in range(b)]


def group_tensors(names: list[str], n_bands: int) -> list[Group]:
    """The groups of the quantized tensors ``names`` (file order kept inside each group), sorted by name."""
    layers = [int(m.group(1)) for n in names if (m := _BLOCK.match(n))]
    n_layers = max(layers) + 1 if layers else 0
    cuts = bands(n_layers, n_bands) if n_layers else []
    members: dict[str, list[str]] = {}
    info: dict[str, tuple[str, tuple[int, int] | None]] = {}
    for n in names:
        m = _BLOCK.match(n)
        if m is None:
            role, band = n.removesuffix(".weight"), None
        else:
            i, role = int(m.group(1)), m.group(2)
            band = next(c for c in cuts if c[0] <= i <= c[1])
        key = role if band is None else f"{role}.{band[0]}-{band[1]}"
        members.setdefault(key, []).append(n)
        info[key] = (role, band)
    return [Group(k, info[k][0], info[k][1], tuple(members[k])) for k in sorted(members)]
