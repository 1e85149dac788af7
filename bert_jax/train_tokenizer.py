r"""Trains a WordPiece vocab.txt or a SentencePiece .model on text files.

  python -m bert_jax.train_tokenizer --input='corpus/*.txt.gz' --kind=wordpiece \
    --vocab_size=30522 --output=vocab.txt
  python -m bert_jax.train_tokenizer --input=bert_jax/data/sample_public_domain.txt \
    --kind=sentencepiece --vocab_size=8000 --output=spm.model --sp_model_type=unigram

Input: .txt/.gz files, one sentence a line (blank lines, lines that are not UTF-8 and binary
files are skipped). The vocab starts with [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4); the same
corpus gives the same bytes on every run. Prints one line: what was written, its vocab size,
the lines read and the fingerprint.
"""

from __future__ import annotations

import time

from absl import flags

from bert_jax import cli
from bert_jax.tokenizers import training as tokenizer_training

_INPUT = flags.DEFINE_string("input", None, "Comma-separated globs of .txt/.gz files.")
_KIND = flags.DEFINE_enum("kind", "wordpiece", ["wordpiece", "sentencepiece"], "Tokenizer kind.")
_VOCAB_SIZE = flags.DEFINE_integer(
  "vocab_size", 30522, "Target vocabulary size (incl. the 5 special tokens)."
)
_OUTPUT = flags.DEFINE_string(
  "output", None, "vocab.txt path (wordpiece) or .model path (sentencepiece)."
)
_LOWERCASE = flags.DEFINE_bool(
  "lowercase", None, "Lower-case (and strip accents). Default: True for wordpiece, False for SP."
)
_SP_MODEL_TYPE = flags.DEFINE_enum(
  "sp_model_type", "unigram", ["unigram", "bpe"], "SentencePiece algorithm."
)
flags.mark_flags_as_required(["input", "output"])


def main(argv: list[str]) -> None:
  del argv
  start = time.time()
  tok, reader = tokenizer_training.train(
    _INPUT.value,
    _KIND.value,
    _VOCAB_SIZE.value,
    _OUTPUT.value,
    _LOWERCASE.value,
    _SP_MODEL_TYPE.value,
  )
  skipped = f", {reader.num_bad_lines} non-UTF-8 lines skipped" if reader.num_bad_lines else ""
  if reader.num_binary_files:
    skipped += f", {reader.num_binary_files} binary files skipped"
  print(
    f"wrote {_OUTPUT.value}: {tok.kind} vocab_size={tok.vocab_size} (asked {_VOCAB_SIZE.value}) "
    f"from {reader.num_lines} lines in {len(reader.files)} file(s){skipped}, "
    f"fingerprint {tok.fingerprint[:12]}, {time.time() - start:.1f}s"
  )


def run() -> None:
  cli.run(main, "train_tokenizer")


if __name__ == "__main__":
  run()
