"""Checkpoint conversion: a trained run to HuggingFace, and any checkpoint to bert_jax.

    python -m bert_jax.convert --src=WORKDIR [--step=N] --dst=HF_DIR   # export, with tokenizer
    python -m bert_jax.convert --src=HF_OR_TF_DIR --dst=PARAMS_DIR      # import
    python -m bert_jax.convert --src=PARAMS_DIR --dst=HF_DIR            # export
    python -m bert_jax.convert --src=RUN/seed_0/best --dst=HF_DIR       # a fine-tuned model

--src is anything `bert_jax.interop.loader.load_checkpoint` reads (a workdir, one orbax step, a
HuggingFace dir, a Google TF checkpoint, a bert_jax params dir), detected from its files.
--dst_format=auto exports bert_jax's own formats to HuggingFace and imports the others into a
params dir. The tokenizer found with the weights goes along (HuggingFace's own files for hf:
WordPiece, or a unigram SentencePiece model; --tokenizer=false leaves it out).
A fine-tuned model (a params dir with task.json, as fine-tuning keeps its best dev point)
exports to BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering
or BertForMultipleChoice with its labels as id2label/label2id; an HF directory of one of those
imports as a params dir with its head and task.json.
"""

from __future__ import annotations

from absl import flags

from bert_jax import cli

_SRC = flags.DEFINE_string(
  "src", None, "Workdir, orbax step dir, HF dir, Google TF checkpoint or params dir."
)
_DST = flags.DEFINE_string("dst", None, "Output directory (must not exist unless --overwrite).")
_STEP = flags.DEFINE_integer("step", None, "Step of a workdir (default: the latest).")
_DST_FORMAT = flags.DEFINE_enum(
  "dst_format",
  "auto",
  ["auto", "hf", "bert_jax"],
  "auto: bert_jax -> hf, anything else -> bert_jax.",
)
_SCAN_LAYERS = flags.DEFINE_enum(
  "scan_layers", "auto", ["auto", "true", "false"], "Layer layout of a bert_jax params dir."
)
_TOKENIZER = flags.DEFINE_bool("tokenizer", True, "Write the checkpoint's tokenizer to --dst.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing --dst.")
flags.mark_flags_as_required(["src", "dst"])


def main(argv: list[str]) -> None:
  from bert_jax.interop import loader

  del argv
  scan = {"auto": None, "true": True, "false": False}[_SCAN_LAYERS.value]
  fmt = loader.convert(
    _SRC.value,
    _DST.value,
    _DST_FORMAT.value,
    scan_layers=scan,
    overwrite=_OVERWRITE.value,
    step=_STEP.value,
    tokenizer=_TOKENIZER.value,
  )
  print(f"convert: wrote {fmt} checkpoint {_DST.value}")


def run() -> None:
  cli.run(main, "convert")


if __name__ == "__main__":
  run()
