"""What a resume may change: the checkpoint's config, tokenizer and data against this run's.

A resumed run is exact when it computes what the uninterrupted run would have. Changes that
keep it so (logging, eval and checkpoint cadence, the mesh, kernels computing the same math,
total_steps) are reported in one line. Changes that break it (optimizer, schedule, batch,
model, masking, seeds, another tokenizer or other data) are refused with one line naming each
field and both values, unless `config.resume_allow_changes` lists them.

Data is compared by what it is, not where it lies: its build options, split sizes and the
content hash of the text it was built from (`dataset.input_sha256`), and the tokenizer's
fingerprint. A path that names the same content (the bundled corpus after a reinstall, a data
directory moved) is no change and is not reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from etils import epath

from bert_jax import trees
from bert_jax.runtime import files

# Config keys (or whole sections) whose change keeps a resume exact, or only changes how the
# rest of the run is carried out. opt.total_steps: extending a run is the usual reason to
# change it; the schedule is recomputed for the new total from the restored step on.
# data.dir/input/vocab/train_vocab_size and the build options name where the data comes from
# and how it was built: what matters is the data itself, compared as `dataset.*`
# (`data_signature`) and `tokenizer` (its fingerprint).
KEEPS_EXACT = (
  "log",
  "eval",
  "ckpt",
  "mesh",
  "init_from",
  "resume_allow_changes",
  "opt.total_steps",
  "data.dir",
  "data.input",
  "data.vocab",
  "data.train_vocab_size",
  "data.max_seq_length",
  "data.dupe_factor",
  "data.short_seq_prob",
  "data.eval_fraction",
  "model.remat_policy",
  # How attention is computed (the same math; 'fused' was its old name for 'auto').
  # model.dropout_rng is not here: it draws other dropout masks, so a change is refused.
  "model.attention_impl",
  # Speed switches of earlier versions, replaced by model.kernels.
  "model.matmul_vjp",
  "model.fuse_qkv",
)

# Data options (metadata.json of a create_data output) that define the examples a run sees.
DATA_FIELDS = (
  "max_seq_length",
  "nsp",
  "packing",
  "dupe_factor",
  "seed",
  "short_seq_prob",
  "eval_fraction",
  "max_predictions_per_seq",
  "masked_lm_prob",
  "masking",
)


# Config keys that name where the data and the vocab come from: when what they name compares
# equal (the data's signature, content hash included; the tokenizer's fingerprint) a new path
# is no change at all.
DATA_PATHS = ("data.dir", "data.input")
VOCAB_PATHS = ("data.vocab",)


def data_signature(metadata: dict[str, Any]) -> dict[str, Any]:
  """The data options, split sizes and the content hash of the input text of a create_data
  output (not its paths, so moved data compares equal; an edited document does not)."""
  sig = {k: metadata.get(k) for k in DATA_FIELDS}
  for split, s in metadata.get("splits", {}).items():
    sig[f"splits.{split}.num_sequences"] = s.get("num_sequences")
    sig[f"splits.{split}.num_tokens"] = s.get("num_tokens")
  sha = (metadata.get("source") or {}).get("input_sha256")
  if sha:
    sig["input_sha256"] = sha
  return sig


def _matches(key: str, names: Iterable[str]) -> bool:
  return any(n == "*" or key == n or key.startswith(n + ".") for n in names)


def parse_allowed(value: str) -> tuple[str, ...]:
  """'opt.lr, data.batch_size' -> ('opt.lr', 'data.batch_size')."""
  return tuple(n.strip() for n in (value or "").split(",") if n.strip())


def allows(key: str, allowed: str) -> bool:
  """Whether `config.resume_allow_changes` (`allowed`) covers the field `key`."""
  return _matches(key, parse_allowed(allowed))


def _changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple]:
  # Keys the checkpoint lacks are knobs of a newer version: not a change the user made.
  return {prefix + k: (old[k], new.get(k)) for k in old if old[k] != new.get(k)}


def config_changes(old: dict[str, Any], new: dict[str, Any], allowed: str = "") -> dict[str, tuple]:
  """{field (dotted): (old value, new value)} for every difference of two configs that
  `allowed` (resume_allow_changes' syntax) does not cover."""
  diffs = _changes(trees.flatten(old, "."), trees.flatten(new, "."))
  return {k: v for k, v in diffs.items() if not allows(k, allowed)}


def compare(
  stored_meta: dict[str, Any], config: dict[str, Any], metadata: dict[str, Any]
) -> dict[str, tuple]:
  """{field: (checkpoint value, this run's value)} for every difference: config keys (dotted),
  'tokenizer' (fingerprints) and 'dataset.<option>' of the data's metadata.json."""
  diffs = config_changes(stored_meta.get("config", {}), config)
  stored_fp = stored_meta.get("tokenizer", {}).get("fingerprint")
  if stored_fp and stored_fp != metadata["tokenizer"]["fingerprint"]:
    diffs["tokenizer"] = (stored_fp[:12], metadata["tokenizer"]["fingerprint"][:12])
  if stored_fp and "tokenizer" not in diffs:
    diffs = {k: v for k, v in diffs.items() if k not in VOCAB_PATHS}
  stored_data = stored_meta.get("data")
  if stored_data is not None:  # checkpoints from before this check lack it
    data = _changes(stored_data, data_signature(metadata), "dataset.")
    if "dataset.input_sha256" in data:
      a, b = data["dataset.input_sha256"]
      data["dataset.input_sha256"] = (a[:12], (b or "none")[:12])
    diffs.update(data)
    # Checkpoints from before the content hash was stored cannot tell a move from a change.
    if stored_data.get("input_sha256") and not data:
      diffs = {k: v for k, v in diffs.items() if k not in DATA_PATHS}
  return diffs


def format_changes(diffs: dict[str, tuple]) -> str:
  return "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diffs.items())


def check(
  stored_meta: dict[str, Any],
  config: dict[str, Any],
  metadata: dict[str, Any],
  source: str,
  allowed: str = "",
) -> list[str]:
  """Raises ValueError (one line) for changes that break exactness and are not allowed;
  returns the one-line reports of the others (empty when nothing changed)."""
  diffs = compare(stored_meta, config, metadata)
  harmless = {k: v for k, v in diffs.items() if _matches(k, KEEPS_EXACT)}
  permitted = {k: v for k, v in diffs.items() if k not in harmless and allows(k, allowed)}
  refused = {k: v for k, v in diffs.items() if k not in harmless and k not in permitted}
  if refused:
    raise ValueError(
      f"resuming {source} would not be exact: {format_changes(refused)} (checkpoint -> now); "
      "restore the "
      f"old values, use a new workdir, or allow it with "
      f"--config.resume_allow_changes={','.join(refused)}"
    )
  lines = []
  if harmless:
    lines.append(f"Resume changes that keep it exact: {format_changes(harmless)}")
  if permitted:
    lines.append(
      f"Resume changes allowed by config.resume_allow_changes: {format_changes(permitted)}"
    )
  return lines


def check_built_data(metadata: dict[str, Any], wanted: dict[str, Any], data_dir: str) -> None:
  """One-line error unless an auto-built data directory holds what the config asks for now:
  `wanted` is `run_data.build_options` plus `input_sha256` (the input's content, so the
  same text under another path, e.g. after a reinstall, is the same data) and `tokenizer` (the
  vocab's fingerprint; None: not compared)."""
  source = metadata.get("source", {})
  built_sha = source.get("input_sha256")
  if not built_sha:
    raise ValueError(
      f"{data_dir}/metadata.json does not record the content of the text it was built from "
      "(built by an older bert_jax): delete it to rebuild, or set config.data.dir to it to use "
      "it as it is"
    )
  have = data_signature(metadata)
  skip = ("input", "input_sha256", "tokenizer")
  diffs = {k: (have.get(k), v) for k, v in wanted.items() if k not in skip and have.get(k) != v}
  if wanted.get("tokenizer") and wanted["tokenizer"] != metadata["tokenizer"]["fingerprint"]:
    diffs["tokenizer"] = (metadata["tokenizer"]["fingerprint"][:12], wanted["tokenizer"][:12])
  text = built_sha != wanted["input_sha256"]
  if text:
    diffs = {
      f"the text of {wanted['input']} (sha256)": (built_sha[:12], wanted["input_sha256"][:12]),
      **diffs,
    }
  if diffs:
    what = ("other text and options" if len(diffs) > 1 else "other text") if text else None
    raise ValueError(
      f"{data_dir} was built {'from ' + what if what else 'with other options'}: "
      f"{format_changes(diffs)} (built -> config); delete it to rebuild, or set "
      "config.data.dir to the data you want"
    )


def record_changes(path: str, step: int, diffs: dict[str, tuple]) -> None:
  """Adds {"step", "changes": {field: [checkpoint, now]}} to `path` (config_changes.jsonl):
  config.json keeps the run's original config. The file is rewritten whole (atomically), not
  appended to: object stores (gs://) have no append, and it gains one row per resume."""
  row = {"step": int(step), "changes": {k: list(v) for k, v in diffs.items()}}
  try:
    old = epath.Path(path).read_text()
  except FileNotFoundError:
    old = ""
  if old and not old.endswith("\n"):  # a torn last row of an older version's append
    old = old[: old.rfind("\n") + 1]
  files.write_atomic(path, old + json.dumps(row) + "\n")
