"""tools/replication/collect.py and walltime.py beside it, imported once per test process
(collect.py defines absl flags at import, which a second copy of the module would define
again): `from unit._collect import collect, walltime`."""

import pathlib
import sys

_TOOLS = str(pathlib.Path(__file__).resolve().parents[2] / "tools" / "replication")
if _TOOLS not in sys.path:
  sys.path.insert(0, _TOOLS)

import collect  # noqa: E402
import walltime  # noqa: E402

__all__ = ["collect", "walltime"]
