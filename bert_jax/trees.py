"""Nested dicts <-> flat {path: leaf} dicts: param trees ("/"-joined, the keys of a params
dir's safetensors) and configs ("."-joined, as in `--config.opt.lr`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(tree: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
  """{"a": {"b": x}} -> {"a/b": x}; an empty mapping is a leaf (so `unflatten` restores it)."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping) and value:
      out.update(flatten(value, sep, path + sep))
    else:
      out[path] = value
  return out


def unflatten(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
  """{"a/b": x} -> {"a": {"b": x}}."""
  tree: dict[str, Any] = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split(sep)
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree
