"""The wall time of a replication root's runs, from ROOT/logs/timeline.tsv: replicate.sh writes
a line when each run starts and when it ends (`EPOCH<TAB>start|end<TAB>PHASE<TAB>EXPERIMENT
<TAB>POINT[<TAB>EXIT]`; exit 75: stopped and saved, to resume). A run is every piece of it (a
stopped run resumes as a new piece); its minutes are its pieces' sum. The end-to-end wall time
is the time during which at least one run was in progress (the union of the pieces), so the
pauses between resumed pieces do not count; lane minutes are the pieces' sum per phase.

  python tools/replication/walltime.py ROOT/logs/timeline.tsv   # the markdown on stdout

collect.py --docs splices the same markdown into docs/replication.md.
"""

from __future__ import annotations

import dataclasses
import sys
import time


@dataclasses.dataclass
class Piece:
  phase: str
  experiment: str
  point: str
  start: int
  end: int | None = None  # None: no end line yet (in progress, or killed without one)
  exit: str = ""


def read(path: str) -> list[Piece]:
  """The pieces of `path`'s lines in start order; a start is closed by the next end line of the
  same run."""
  pieces: list[Piece] = []
  open_: dict[tuple[str, str, str], Piece] = {}
  with open(path) as f:
    rows = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
  for n, row in enumerate(sorted(rows, key=lambda r: int(r[0])), 1):
    if len(row) < 5 or row[1] not in ("start", "end") or not row[0].isdigit():
      raise ValueError(f"{path}: line {n} is not EPOCH, start|end, PHASE, EXPERIMENT, POINT")
    t, kind, key = int(row[0]), row[1], (row[2], row[3], row[4])
    if kind == "start":
      open_[key] = Piece(*key, start=t)
      pieces.append(open_[key])
    elif key in open_:
      piece = open_.pop(key)
      piece.end, piece.exit = t, row[5] if len(row) > 5 else ""
  return pieces


def busy_seconds(pieces: list[Piece]) -> int:
  """Seconds during which at least one closed piece was in progress."""
  total, reach = 0, None
  for a, b in sorted((p.start, p.end) for p in pieces if p.end is not None):
    if reach is None or a > reach:
      total += b - a
      reach = b
    elif b > reach:
      total += b - reach
      reach = b
  return total


# Pieces this short that exit 0 are counted in a run's row, not listed one by one.
SHORT_S = 30


def _hm(t: int) -> str:
  return time.strftime("%H:%M", time.gmtime(t))


def markdown(pieces: list[Piece]) -> str:
  """The summary and a row per run (phase, experiment, point), in order of first start."""
  if not pieces:
    return "No run has started."
  runs: dict[tuple[str, str, str], list[Piece]] = {}
  for p in pieces:
    runs.setdefault((p.phase, p.experiment, p.point), []).append(p)
  closed = [p for p in pieces if p.end is not None]
  first = min(p.start for p in pieces)
  last = max((p.end for p in closed), default=first)
  day = lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))
  lines = [
    f"From {day(first)} to {day(last)} UTC ({(last - first) / 3600:.1f} h): at least one run in"
    f" progress for **{busy_seconds(pieces) / 60:.0f} minutes** (the end-to-end wall time,"
    " pauses between resumed pieces left out).",
    "",
  ]
  for phase in sorted({p.phase for p in pieces}, reverse=True):
    mine = [p for p in closed if p.phase == phase]
    names = {(p.experiment, p.point) for p in pieces if p.phase == phase}
    lane = sum(p.end - p.start for p in mine) / 60
    lines.append(
      f"- {phase}: {lane:.0f} lane minutes, {len(names)} runs in {len(mine)} finished pieces"
    )
  running = [p for p in pieces if p.end is None]
  if running:
    now = ", ".join(f"{p.experiment}/{p.point} ({p.phase}, since {_hm(p.start)})" for p in running)
    lines.append(f"- in progress (no end line): {now}")
  lines += [
    "",
    "| phase | run | pieces (UTC, exit status; 75: stopped and saved) | minutes |",
    "|---|---|---|---|",
  ]
  for (phase, exp, point), ps in runs.items():
    # A driver that starts again walks its queue: a finished run is a piece of a few seconds.
    short = [p for p in ps if p.end is not None and p.end - p.start < SHORT_S and p.exit == "0"]
    spans = ", ".join(
      f"{_hm(p.start)}-{_hm(p.end)} ({p.exit})" if p.end is not None else f"{_hm(p.start)}-"
      for p in ps
      if p not in short
    )
    if short:
      spans += f"{', ' if spans else ''}{len(short)} under {SHORT_S} s (found finished)"
    minutes = sum(p.end - p.start for p in ps if p.end is not None) / 60
    lines.append(f"| {phase} | {exp}/{point} | {spans} | {minutes:.1f} |")
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print("usage: walltime.py ROOT/logs/timeline.tsv", file=sys.stderr)
    return 2
  try:
    print(markdown(read(argv[1])))
  except (OSError, ValueError) as e:
    print(f"walltime.py: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
