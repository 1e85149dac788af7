"""A run's dataset: the data a training config names (config.data.dir) or builds on first use
into <workdir>/data (`pretraining.build` on config.data.input), checked against the config
before anything is written and reused by every rerun that would build the same.

  run_data.check_source(config, workdir)               # unreadable input: one line, nothing written
  run_data.planned_metadata(config, workdir)           # what the trainer checks the config against
  data_dir = run_data.ensure_built(config, workdir)    # config.data.dir or <workdir>/data
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from bert_jax.data import corpus
from bert_jax.data.pretraining import NoEvalSplit, build, format_summary
from bert_jax.runtime import files, preemption


def build_options(config) -> dict[str, Any]:
  """The `build` arguments that a training config's data section asks for."""
  return {
    "input": config.data.input,
    "max_seq_length": config.data.max_seq_length,
    "max_predictions_per_seq": config.masking.max_predictions,
    "short_seq_prob": config.data.short_seq_prob,
    "dupe_factor": config.data.dupe_factor,
    "nsp": bool(config.objective.nsp),
    "eval_fraction": config.data.eval_fraction,
    "seed": config.data.seed,
  }


def check_source(config, workdir: str | None = None) -> None:
  """One line, before a run creates anything, when its data cannot be read: `config.data.dir`
  without metadata.json or on an object store, `config.data.input` matching no file, or
  neither set; with `workdir`, also a `<workdir>/data` that cannot be built there (an object
  store)."""
  from bert_jax.runtime import files

  if config.data.dir and files.is_remote(config.data.dir):
    raise ValueError(
      f"config.data.dir={config.data.dir}: ArrayRecord reads local files only; copy the data to "
      "local disk on every host (e.g. gcloud storage cp -r) and set config.data.dir to the copy"
    )
  if config.data.dir:
    if not os.path.isfile(os.path.join(config.data.dir, "metadata.json")):
      raise FileNotFoundError(
        f"config.data.dir={config.data.dir} has no metadata.json: build it with "
        "python -m bert_jax.create_data"
      )
    return
  if workdir is not None and files.is_remote(workdir):
    raise ValueError(
      f"workdir {workdir} is on an object store, where <workdir>/data cannot be built "
      "(ArrayRecord reads local files only): build config.data.input with python -m "
      "bert_jax.create_data into a local directory on every host and set config.data.dir to it"
    )
  if not config.data.input:
    raise ValueError("set config.data.dir (a create_data output) or config.data.input (text)")
  files.expand_inputs(config.data.input, "--config.data.input")


def planned_metadata(config, workdir: str) -> dict[str, Any]:
  """The metadata.json a run will train on, known before anything is built: that of
  `config.data.dir` or of an existing `<workdir>/data`; else what `ensure_built` will build
  (its tokenizer's kind and size, the length, NSP), for the checks of the config against its
  data before anything is written."""
  from bert_jax.data.input_pipeline import read_metadata
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  data_dir = config.data.dir or os.path.join(workdir, "data")
  if os.path.isfile(os.path.join(data_dir, "metadata.json")):
    return read_metadata(data_dir)
  if config.data.train_vocab_size:
    tok = {"kind": "wordpiece", "vocab_size": int(config.data.train_vocab_size)}
  else:
    t = tokenizer_lib.load_tokenizer(config.data.vocab or tokenizer_lib.default_vocab_path())
    tok = {"kind": t.kind, "vocab_size": int(t.vocab_size)}
  return {
    "tokenizer": tok,
    "max_seq_length": int(config.data.max_seq_length),
    "nsp": bool(config.objective.nsp),
  }


def ensure_built(config, workdir: str) -> str:
  """The dataset directory of a training run: `config.data.dir`, or `config.data.input` built
  into `<workdir>/data` on first use, with a WordPiece vocab of `config.data.train_vocab_size`
  trained on it first (into `<workdir>/vocab.txt`) when that is set (the bundled default).

  `<workdir>/data` is reused when it was built from the same text (its content_sha256, wherever
  the files are now: a reinstall moves the bundled corpus), the same options and the same
  vocab; anything else is refused in one line naming what differs.

  ArrayRecord reads local files only, so data on an object store is refused with one line,
  never copied to local disk behind the user's back; and under a gs:// workdir `<workdir>/data`
  is not built (a local build would sit on process 0's disk only, invisible to the other hosts
  and to the next run on another machine): set config.data.dir to a local create_data output.
  """
  import jax

  from bert_jax.data.input_pipeline import read_metadata
  from bert_jax.runtime import resume
  from bert_jax.tokenizers import tokenizer as tokenizer_lib

  check_source(config, workdir)
  if config.data.dir:
    return config.data.dir
  data_dir = os.path.join(workdir, "data")
  options = build_options(config)
  n_vocab = config.data.train_vocab_size
  trained_vocab = os.path.join(workdir, "vocab.txt")
  if os.path.isfile(os.path.join(data_dir, "metadata.json")):
    if n_vocab:  # what the data was built with: trained from the same text, so the same
      vocab = trained_vocab if os.path.isfile(trained_vocab) else None
    else:
      vocab = config.data.vocab or tokenizer_lib.default_vocab_path()
    wanted = {
      **options,
      "input_sha256": corpus.content_sha256(files.expand_inputs(config.data.input)),
      "tokenizer": tokenizer_lib.load_tokenizer(vocab).fingerprint if vocab else None,
    }
    resume.check_built_data(read_metadata(data_dir), wanted, data_dir)
    return data_dir
  # config_schema.check_pretraining has checked data.vocab, train_vocab_size and model.vocab_size.
  error = None
  if jax.process_index() == 0:
    try:
      # A signal stops the build at once, on every process (below): a preempted job leaves
      # within its grace period, not after a whole build.
      with preemption.stoppable():
        _build_for_run(config, options, data_dir, trained_vocab)
    except preemption.Preempted as e:
      if jax.process_count() == 1:
        raise
      error = ("preempted", f"process 0: {e.message}"[:1000])
    except (ValueError, OSError) as e:
      if jax.process_count() == 1:
        raise
      error = ("error", f"process 0: {e}"[:1000])
  if jax.process_count() > 1:
    # Every process learns how the build ended and stops with it, together: none waits in a
    # collective for a process that left (or for the coordinator, process 0, to be gone).
    from jax.experimental import multihost_utils

    text = json.dumps(error or ["ok", ""]).encode()
    code = np.frombuffer(text.ljust(4096), np.uint8)  # (messages are cut at 1000 characters)
    kind, message = json.loads(
      bytes(np.asarray(multihost_utils.broadcast_one_to_all(code))).decode().rstrip()
    )
    if kind == "preempted":
      raise preemption.Preempted(message)
    if kind == "error":
      raise OSError(message)
  return data_dir


def _build_for_run(config, options: dict[str, Any], data_dir: str, trained_vocab: str) -> None:
  """The vocab (when the config trains one) and the data of `ensure_built` (process 0)."""
  from bert_jax.tokenizers import tokenizer as tokenizer_lib
  from bert_jax.tokenizers import training as tokenizer_training

  n_vocab = config.data.train_vocab_size
  vocab = config.data.vocab or tokenizer_lib.default_vocab_path()
  if n_vocab:
    # A WordPiece vocab of the corpus itself (lower-cased like BERT's uncased vocab).
    vocab = trained_vocab
    tok, _ = tokenizer_training.train(config.data.input, "wordpiece", n_vocab, vocab)
    if tok.vocab_size != n_vocab:
      raise ValueError(
        f"config.data.train_vocab_size={n_vocab}: {config.data.input} only yields "
        f"{tok.vocab_size} WordPiece tokens; ask for fewer"
      )
    print(f"Trained a {n_vocab}-token WordPiece vocab on {config.data.input} into {vocab}")
  print(f"Building pretraining data from {config.data.input} into {data_dir}", flush=True)
  try:
    summary = build(**options, output_dir=data_dir, vocab=vocab, progress=False)
  except NoEvalSplit:  # the trainer evaluates on it: no eval split is no run
    raise NoEvalSplit(
      f"config.data.input={config.data.input}: no document of it is held out for the eval "
      "split that every run evaluates on (one document, or a few short ones, at "
      f"config.data.eval_fraction={config.data.eval_fraction}): give it at least 2 documents "
      "(a blank line ends one), or build an eval split yourself (python -m "
      "bert_jax.create_data) and set config.data.dir"
    ) from None
  print(format_summary(summary), flush=True)
