"""Builds a pretraining dataset: text -> ArrayRecord shards + tokenizer/ + metadata.json.

  python -m bert_jax.create_data --input='corpus/*.txt.gz' --output_dir=DIR [--vocab=PATH]

Input: .txt/.gz files, one sentence a line, a blank line between documents; or a local TFDS
text dataset (--tfds_name; needs `pip install 'bert_jax[tfds]'`). "\n", "\r\n" and a lone "\r"
each end a line. Sequences are google-research/bert's: sentence pairs for next-sentence
prediction, or with --nsp=False full sentences packed up to --max_seq_length (--packing). A
share of the documents (--eval_fraction, at least one of a corpus of 2 or more) is held out as
the eval split. --output_dir gets {train,eval}-NNNNN-of-NNNNN.array_record, tokenizer/ and
metadata.json (the options, the input's content hash, the counts), the same bytes for any
--num_workers. The summary (documents, sequences, tokens, what was skipped) goes to stderr.

SIGTERM, SIGINT (Ctrl-C) or SIGHUP stop a build with one line and exit status 128 + the
signal's number; nothing of it is left in --output_dir (an old dataset there stays as it was).
"""

from __future__ import annotations

import signal
import sys

from absl import flags

from bert_jax import cli, config_schema
from bert_jax.data import pretraining as pretraining_data
from bert_jax.data import sequences
from bert_jax.runtime import files

_INPUT = flags.DEFINE_string(
  "input", None, "Comma-separated globs of .txt/.gz files (a sentence a line)."
)
_TFDS_NAME = flags.DEFINE_string(
  "tfds_name", None, "A TFDS text dataset prepared under --tfds_data_dir."
)
_TFDS_DATA_DIR = flags.DEFINE_string(
  "tfds_data_dir", None, "Local TFDS data dir (never downloads)."
)
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "TFDS split to read.")
_TFDS_TEXT_KEY = flags.DEFINE_string(
  "tfds_text_key", "text", "TFDS feature holding the document text."
)
_OUTPUT_DIR = flags.DEFINE_string(
  "output_dir", None, "Directory for shards, tokenizer/ and metadata.json."
)
_VOCAB = flags.DEFINE_string(
  "vocab", None, "vocab.txt, .model or tokenizer dir (default: bundled BERT)."
)
_MAX_SEQ_LENGTH = flags.DEFINE_integer(
  "max_seq_length", 128, "Maximum tokens per sequence incl. [CLS]/[SEP]."
)
_MAX_PREDICTIONS = flags.DEFINE_integer(
  "max_predictions_per_seq", 20, "Masked positions per sequence (cap)."
)
_MASKED_LM_PROB = flags.DEFINE_float("masked_lm_prob", 0.15, "Share of tokens to mask.")
_SHORT_SEQ_PROB = flags.DEFINE_float(
  "short_seq_prob", 0.1, "Probability of a shorter random target length."
)
_DUPE_FACTOR = flags.DEFINE_integer(
  "dupe_factor",
  sequences.DUPE_FACTOR,
  "Passes over the corpus, each re-drawing segmentation and pairs (the original BERT's: 10).",
)
_SEED = flags.DEFINE_integer("seed", 12345, "Random seed (segmentation, pairing, written masks).")
_NSP = flags.DEFINE_bool("nsp", True, "Sentence pairs for next-sentence prediction; else packing.")
_PACKING = flags.DEFINE_enum(
  "packing",
  "full_sentences",
  ["full_sentences", "doc_sentences"],
  "With --nsp=False: cross document boundaries or not.",
)
_EVAL_FRACTION = flags.DEFINE_float(
  "eval_fraction", 0.01, "Share of documents held out for the eval split."
)
_WRITE_MASKS = flags.DEFINE_bool(
  "write_masks", False, "Also store static masks (as training would compute)."
)
_WHOLE_WORD_MASK = flags.DEFINE_bool(
  "whole_word_mask", False, "Whole-word masking for --write_masks."
)
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "Worker processes (default: CPU count).")
_RECORDS_PER_SHARD = flags.DEFINE_integer(
  "records_per_shard", 100_000, "Records per ArrayRecord shard."
)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a dataset already in --output_dir.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Progress bar on stderr.")
flags.mark_flags_as_required(["output_dir"])
flags.mark_flags_as_mutual_exclusive(["input", "tfds_name"], required=True)


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stopped(BaseException):
  """A signal stopped the build: a BaseException, so that every `except Exception` on the way
  lets it through while the build's own clean-up runs."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _stop(signum: int, frame) -> None:
  del frame
  for sig in _SIGNALS:  # a second Ctrl-C must not cut the clean-up short
    signal.signal(sig, signal.SIG_IGN)
  files.interrupt(_Stopped(signum))  # at once, or once the dataset is whole in place


def main(argv: list[str]) -> None:
  del argv
  for sig in _SIGNALS:
    signal.signal(sig, _stop)
  try:
    summary = _build()
  except _Stopped as e:
    name = signal.Signals(e.signum).name
    if getattr(e, "published", False):  # it came while the finished dataset was put in place
      what = f"{_OUTPUT_DIR.value} holds the new dataset whole"
    else:
      what = (
        f"nothing of this build is left in {_OUTPUT_DIR.value}; rerun the same command to build it"
      )
    print(f"create_data: {name} received: stopped; {what}", file=sys.stderr)
    sys.exit(128 + e.signum)
  print(pretraining_data.format_summary(summary), file=sys.stderr)
  if summary.get("identical"):
    print(
      f"create_data: another build of this very dataset (build {summary['build_id'][:12]}) "
      f"finished into {_OUTPUT_DIR.value} first: kept it",
      file=sys.stderr,
    )


def _options() -> dict:
  """The build options the flags give (each checked by config_schema.check_data_build)."""
  return dict(
    max_seq_length=_MAX_SEQ_LENGTH.value,
    max_predictions_per_seq=_MAX_PREDICTIONS.value,
    masked_lm_prob=_MASKED_LM_PROB.value,
    short_seq_prob=_SHORT_SEQ_PROB.value,
    dupe_factor=_DUPE_FACTOR.value,
    seed=_SEED.value,
    nsp=_NSP.value,
    packing=_PACKING.value,
    eval_fraction=_EVAL_FRACTION.value,
    write_masks=_WRITE_MASKS.value,
    whole_word_mask=_WHOLE_WORD_MASK.value,
    num_workers=_NUM_WORKERS.value,
    records_per_shard=_RECORDS_PER_SHARD.value,
    overwrite=_OVERWRITE.value,
    progress=_PROGRESS.value,
  )


def _build() -> dict:
  return pretraining_data.build(
    _INPUT.value,
    _OUTPUT_DIR.value or "",
    vocab=_VOCAB.value,
    tfds_name=_TFDS_NAME.value,
    tfds_data_dir=_TFDS_DATA_DIR.value,
    tfds_split=_TFDS_SPLIT.value,
    tfds_text_key=_TFDS_TEXT_KEY.value,
    **_options(),
  )


def run() -> None:
  cli.run(main, "create_data", check=lambda: config_schema.check_data_build(_options()))


if __name__ == "__main__":
  run()
