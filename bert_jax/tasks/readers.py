"""Fine-tuning examples from files: JSONL, CSV, TSV, CoNLL columns, GLUE's TSVs, local TFDS glue.

`read_split(config.task, "train")` returns the split's examples in file order (each format is
read by `formats`). Every error a user's data can cause is one line naming the file and line
(`path:line: what is wrong`), so a bad row in a 400k-line file is found without a debugger.

The GLUE presets (`GLUE`) read the standard GLUE directory layout (`<glue_dir>/SST-2/train.tsv`,
`MNLI/dev_matched.tsv`, ...) by the column names of each file's header; CoLA's train and dev
files have no header and get GLUE's column names here. Test splits may carry no labels (label
None: the run writes predictions and no metrics), but not in some rows only (one line naming
the first row that differs).
With `format="tfds"` the same presets read a TFDS `glue/<config>` dataset that was prepared
beforehand in array_record format; nothing is ever downloaded.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from typing import Any

from bert_jax.tasks import formats, kinds
from bert_jax.tasks.formats import Example, TaggedExample, TextExample

SPLITS = ("train", "dev", "test")
FORMATS = ("jsonl", "csv", "tsv", "conll", "glue", "tfds")
_SUFFIX_FORMATS = {
  ".jsonl": "jsonl",
  ".json": "jsonl",
  ".csv": "csv",
  ".tsv": "tsv",
  ".conll": "conll",
  ".iob": "conll",
  ".bio": "conll",
}


# --- GLUE presets --------------------------------------------------------------------------


def _glue(
  dir: str,
  text_fields: tuple[str, ...],
  label_field: str,
  labels: tuple[str, ...],
  tfds_text: tuple[str, ...],
  metrics: tuple[str, ...] = ("accuracy",),
  kind: str = "classification",
  dev: str = "dev.tsv",
  test: str = "test.tsv",
  tfds_dev: str = "validation",
  tfds_test: str = "test",
  main_metric: str = "",
  **extra: Any,
) -> dict[str, Any]:
  return dict(
    dir=dir,
    files={"train": "train.tsv", "dev": dev, "test": test},
    text_fields=text_fields,
    label_field=label_field,
    labels=labels,
    kind=kind,
    metrics=metrics,
    main_metric=main_metric or metrics[0],
    tfds_text=tfds_text,
    tfds_splits={"train": "train", "dev": tfds_dev, "test": tfds_test},
    **extra,
  )


_MNLI = dict(
  dir="MNLI",
  text_fields=("sentence1", "sentence2"),
  label_field="gold_label",
  labels=("contradiction", "entailment", "neutral"),
  tfds_text=("premise", "hypothesis"),
  tfds="mnli",
)

# Column names are those of GLUE's TSV headers; label sets in GLUE's (and transformers') order.
GLUE: dict[str, dict[str, Any]] = {
  "cola": _glue(
    "CoLA",
    ("sentence",),
    "label",
    ("0", "1"),
    ("sentence",),
    metrics=("mcc",),
    # train.tsv / dev.tsv have no header: source, label, original judgement, sentence.
    fieldnames=("source", "label", "label_notation", "sentence"),
    headerless=("train", "dev"),
  ),
  "sst2": _glue("SST-2", ("sentence",), "label", ("0", "1"), ("sentence",)),
  "mrpc": _glue(
    "MRPC",
    ("#1 String", "#2 String"),
    "Quality",
    ("0", "1"),
    ("sentence1", "sentence2"),
    metrics=("f1", "accuracy"),
  ),
  "stsb": _glue(
    "STS-B",
    ("sentence1", "sentence2"),
    "score",
    (),
    ("sentence1", "sentence2"),
    metrics=("pearson", "spearman"),
    main_metric="spearman",  # the BERT paper's STS-B column
    kind="regression",
  ),
  "qqp": _glue(
    "QQP",
    ("question1", "question2"),
    "is_duplicate",
    ("0", "1"),
    ("question1", "question2"),
    metrics=("f1", "accuracy"),
  ),
  "mnli": _glue(
    **_MNLI,
    dev="dev_matched.tsv",
    test="test_matched.tsv",
    tfds_dev="validation_matched",
    tfds_test="test_matched",
  ),
  "mnli_mismatched": _glue(
    **_MNLI,
    dev="dev_mismatched.tsv",
    test="test_mismatched.tsv",
    tfds_dev="validation_mismatched",
    tfds_test="test_mismatched",
  ),
  "qnli": _glue(
    "QNLI",
    ("question", "sentence"),
    "label",
    ("entailment", "not_entailment"),
    ("question", "sentence"),
  ),
  "rte": _glue(
    "RTE",
    ("sentence1", "sentence2"),
    "label",
    ("entailment", "not_entailment"),
    ("sentence1", "sentence2"),
  ),
  "wnli": _glue(
    "WNLI", ("sentence1", "sentence2"), "label", ("0", "1"), ("sentence1", "sentence2")
  ),
}
for _name, _preset in GLUE.items():
  _preset.setdefault("tfds", _name)


def glue_preset(task: Any) -> dict[str, Any]:
  """The GLUE preset named by `task.name` (format "glue" or "tfds")."""
  name = _get(task, "name", "")
  if name not in GLUE:
    raise ValueError(
      f"task.name={name!r} is not a GLUE task (format={_get(task, 'format', '')!r} needs one of "
      f"{', '.join(GLUE)})"
    )
  return GLUE[name]


# --- Public API ----------------------------------------------------------------------------


def _get(task: Any, name: str, default: Any) -> Any:
  # Configs built before a field existed still read (ConfigDict and dict both have .get).
  value = task.get(name, default)
  return default if value is None else value


def _format(task: Any, path: str) -> str:
  fmt = _get(task, "format", "auto") or "auto"
  if fmt != "auto":
    if fmt not in FORMATS:
      raise ValueError(f"task.format={fmt!r} is not one of auto, {', '.join(FORMATS)}")
    return fmt
  stem = path[:-3] if path.endswith(".gz") else path
  suffix = os.path.splitext(stem)[1].lower()
  if suffix not in _SUFFIX_FORMATS:
    raise ValueError(
      f"{path}: cannot tell the format from the suffix {suffix or '(none)'!r}; set task.format "
      f"to one of {', '.join(FORMATS)}"
    )
  return _SUFFIX_FORMATS[suffix]


def has_split(task: Any, split: str) -> bool:
  """Whether the task defines `split` (GLUE / TFDS presets have all three)."""
  if split not in SPLITS:
    raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
  return _get(task, "format", "auto") in ("glue", "tfds") or bool(_get(task, split, ""))


def split_files(task: Any, split: str) -> list[str]:
  """The files the task's `split` is read from ([] for none), in reading order: a GLUE preset's
  file under glue_dir, every file of a prepared TFDS dataset, a SQuAD split's comma-separated
  files, or the file task.<split> names. What a resume fingerprints (finetune)."""
  if not has_split(task, split):
    return []
  fmt = _get(task, "format", "auto")
  if fmt == "glue":
    preset = glue_preset(task)
    return [
      _get(task, split, "")
      or os.path.join(os.fspath(_get(task, "glue_dir", "")), preset["dir"], preset["files"][split])
    ]
  if fmt == "tfds":
    root = _tfds_version_dir(os.path.join(_tfds_data_dir(task), "glue", glue_preset(task)["tfds"]))
    if root is None:
      return []
    return sorted(os.path.join(d, name) for d, _, names in os.walk(root) for name in names)
  path = os.fspath(_get(task, split, ""))
  if kinds.get(_get(task, "kind", "classification")).examples == "squad":
    return [p for p in path.split(",") if p]
  return [path]


def read_split(task: Any, split: str) -> list[Example]:
  """The examples of `split` ("train" | "dev" | "test") of `task` (config.task), in file order.

  TextExample for classification / regression / multiple_choice, TaggedExample for tagging.
  Only the first `task.max_examples` examples are read when it is > 0. With format "glue" the
  preset's file under task.glue_dir is read unless task.<split> names another file.
  """
  kind = _get(task, "kind", "classification")
  spec = kinds.get(kind)
  if spec.examples not in ("text", "tagged"):
    raise ValueError(
      f"task.kind={kind!r} is read by bert_jax.tasks.{spec.examples}, not by readers"
    )
  if not has_split(task, split):
    raise ValueError(f"task {_get(task, 'name', '')!r} has no {split} split (task.{split} is '')")
  limit = int(_get(task, "max_examples", 0)) or sys.maxsize
  fmt = _get(task, "format", "auto")
  if fmt == "glue":
    path, examples = _read_glue(task, split, limit)
  elif fmt == "tfds":
    path, examples = _read_tfds(task, split, limit)
  else:
    path = os.fspath(_get(task, split, ""))
    fmt = _format(task, path)
    if spec.examples == "tagged":
      if fmt == "jsonl":
        tokens_field = _get(task, "tokens_field", "tokens")
        tags_field = _get(task, "tags_field", "tags")
        examples = formats.tagged_jsonl(path, split, limit, tokens_field, tags_field)
      elif fmt == "conll":
        word_col, tag_col = int(_get(task, "word_column", 0)), int(_get(task, "tag_column", -1))
        examples = formats.conll(path, split, limit, word_col, tag_col)
      else:
        raise ValueError(f"{path}: tagging reads jsonl or conll files, not {fmt}")
    else:
      if fmt == "conll":
        raise ValueError(f"{path}: conll files hold tagging data, not task.kind={kind!r}")
      fields = tuple(_get(task, "text_fields", ()))
      label_field = _get(task, "label_field", "label")
      rows = formats.jsonl_rows(path) if fmt == "jsonl" else formats.table_rows(path, fmt)
      examples = formats.text_examples(rows, fields, label_field, spec, split, limit)
  if not examples:
    raise ValueError(f"{path}: the {split} split is empty (no examples)")
  return examples


def label_list(
  task: Any, train_examples: Sequence[Example], extra: Sequence[Sequence[Example]] = ()
) -> list[str]:
  """Class (or tag) names in index order: task.labels if set, a GLUE preset's, else the sorted
  unique labels of train (and of the `extra` splits: brown_pos's dev and test hold a few rare
  tags that train lacks). Regression and multiple choice have none ([])."""
  if not kinds.get(_get(task, "kind", "classification")).labelled:
    return []
  given = _get(task, "labels", ())
  if given:
    return [str(x) for x in given]
  if _get(task, "format", "auto") in ("glue", "tfds"):
    return list(glue_preset(task)["labels"])
  seen: set[str] = set()
  for ex in itertools.chain(train_examples, *extra):
    if isinstance(ex, TaggedExample):
      seen.update(ex.tags or ())
    elif ex.label is not None:
      seen.add(str(ex.label))
  return sorted(seen)


def check_labels(examples: Sequence[Example], labels: Sequence[str], split: str) -> None:
  """One-line ValueError naming file:line of the first label (or tag) not in `labels`.

  Multiple-choice labels must be an ending's index; regression labels are not checked.
  """
  known = set(labels)
  preview = ", ".join(list(labels)[:20]) + (", ..." if len(labels) > 20 else "")
  for ex in examples:
    if isinstance(ex, TaggedExample):
      for i, tag in enumerate(ex.tags or ()):
        if tag not in known:
          raise ValueError(
            f"{ex.source}: {split} tag {tag!r} (word {i + 1}, {ex.words[i]!r}) is not one of the "
            f"{len(known)} labels ({preview})"
          )
    elif isinstance(ex.label, str) and known and ex.label not in known:
      raise ValueError(
        f"{ex.source}: {split} label {ex.label!r} is not one of the {len(known)} labels ({preview})"
      )
    elif isinstance(ex.label, str) and not known:
      choice = _choice_index(ex.label)
      if choice is None or not 0 <= choice < len(ex.texts) - 1:
        raise ValueError(
          f"{ex.source}: {split} label {ex.label!r} is not the index of one of the "
          f"{len(ex.texts) - 1} endings"
        )


def _choice_index(label: str) -> int | None:
  try:
    return int(label)
  except ValueError:
    return None


# --- GLUE TSV and TFDS ---------------------------------------------------------------------


def _read_glue(task: Any, split: str, limit: int) -> tuple[str, list[Example]]:
  preset = glue_preset(task)
  path = _get(task, split, "") or os.path.join(
    os.fspath(_get(task, "glue_dir", "")), preset["dir"], preset["files"][split]
  )
  fieldnames = preset["fieldnames"] if split in preset.get("headerless", ()) else None
  rows = formats.table_rows(path, "tsv", fieldnames)
  spec = kinds.get(preset["kind"])
  return path, formats.text_examples(
    rows, preset["text_fields"], preset["label_field"], spec, split, limit
  )


def _tfds_version_dir(root: str) -> str | None:
  if not os.path.isdir(root):
    return None
  versions = []
  for name in os.listdir(root):
    parts = name.split(".")
    if all(p.isdigit() for p in parts) and len(parts) == 3:
      if os.path.isfile(os.path.join(root, name, "dataset_info.json")):
        versions.append(tuple(int(p) for p in parts))
  if not versions:
    return None
  return os.path.join(root, ".".join(map(str, max(versions))))


def _tfds_data_dir(task: Any) -> str:
  return os.fspath(
    _get(task, "tfds_data_dir", "")
    or os.environ.get("TFDS_DATA_DIR", "")
    or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
  )


def _read_tfds(task: Any, split: str, limit: int) -> tuple[str, list[Example]]:
  """A locally prepared TFDS glue/<config> (array_record). Never downloads."""
  preset = glue_preset(task)
  config = preset["tfds"]
  data_dir = _tfds_data_dir(task)
  root = os.path.join(data_dir, "glue", config)
  version_dir = _tfds_version_dir(root)
  if version_dir is None:
    raise FileNotFoundError(
      f"{root}: no prepared TFDS dataset glue/{config} (this reader never downloads; prepare it "
      f"where there is network with `tfds build glue/{config} --data_dir={data_dir} "
      "--file_format=array_record` and copy the directory here)"
    )
  import tensorflow_datasets as tfds  # only TFDS users pay the import

  builder = tfds.builder_from_directory(version_dir)
  split_name = preset["tfds_splits"][split]
  if split_name not in builder.info.splits:
    raise ValueError(
      f"{version_dir}: has no split {split_name!r} ({', '.join(builder.info.splits)})"
    )
  try:
    source = builder.as_data_source(split=split_name)
  except Exception as e:  # noqa: BLE001 - TFDS raises several types for a wrong file format
    first_line = (str(e).splitlines() or [type(e).__name__])[0]
    raise ValueError(
      f"{version_dir}: cannot be read without TensorFlow ({first_line}); prepare it with "
      f"`tfds build glue/{config} --file_format=array_record`"
    ) from None
  label_feature = builder.info.features["label"]
  names = list(getattr(label_feature, "names", ()) or ())
  spec = kinds.get(preset["kind"])
  labelled = not split_name.startswith("test")
  out: list[Example] = []
  for i in range(min(len(source), limit)):
    record = source[i]
    where = f"{version_dir}[{split_name}]:{i}"
    texts = []
    for name in preset["tfds_text"]:
      value = record[name]
      try:
        texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
      except UnicodeDecodeError:
        raise ValueError(f"{where}: feature {name!r} is not UTF-8 text") from None
    label: str | float | None = None
    raw = record["label"]
    if labelled and spec.value_label:
      label = float(raw)
    elif labelled and int(raw) >= 0:
      # TFDS's ClassLabel names ("positive") -> GLUE's label strings ("1"), by name or index.
      name = names[int(raw)] if names else str(int(raw))
      label = name if name in preset["labels"] else str(int(raw))
    out.append(TextExample(tuple(texts), label, where))
  return f"{version_dir}[{split_name}]", out
