"""Text documents -> BERT pretraining sequences -> ArrayRecord shards + metadata.json.

The library behind `python -m bert_jax.create_data` (its flags are the arguments of `build`) and
the trainer's dataset (data/run_data.py builds it with `build`):

  summary = pretraining_data.build("corpus/*.txt.gz", "DIR", vocab="vocab.txt")

Input: one sentence a line, a blank line between documents (the original BERT format); .txt or
.gz, comma-separated globs; or a local TFDS text dataset (--tfds_name, --tfds_data_dir; never
downloaded). A document also ends at the end of its file. Reading: bert_jax.data.corpus.

Sequences follow google-research/bert `create_instances_from_document` (NSP pairs), or pack
full sentences when NSP is off (RoBERTa FULL-/DOC-SENTENCES): bert_jax.data.sequences.
`--dupe_factor` passes re-draw segmentation and pairing, and with static masks the masks
(sequences.DUPE_FACTOR, 1: the one default, here and in the training configs; the original's
was 10, to re-draw the masks it stored).

Streaming, parallel and deterministic (bert_jax.data.writer): documents are shuffled externally
into chunks of ~4 MB of text, each chunk a uniform random sample of the corpus and an
independent work unit seeded from (seed, split, dupe pass, chunk index); workers build the
sequences and the parent writes them in chunk order, so the output is byte-identical for any
--num_workers and memory stays at a few chunks. Held-out documents (--eval_fraction) are chosen
by a hash of their text; a corpus that fits in one chunk gets at least 3 eval documents (at
most a tenth of its documents, and at least one).

Output (the record format is bert_jax.data.records): DIR/{train,eval}-NNNNN-of-NNNNN
.array_record, DIR/tokenizer/, DIR/metadata.json (the options, the tokenizer's fingerprint, the
counts, and `source.input_sha256`: what the input text is, whatever its path). Everything is
written under a temporary directory (`DIR/.create_data-<pid>-*`) and renamed at the end,
metadata.json last. A build that fails (a full disk: one line) or is stopped by a signal leaves
nothing (an --output_dir it made goes too); what a SIGKILLed one left, the next success removes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bert_jax.data import corpus, records, sequences
from bert_jax.data import writer as data_writer
from bert_jax.runtime import files

# The temporary directory a build writes into, beside its output: `.create_data-<pid>-*`.
TMP_PREFIX = ".create_data-"


class NoEvalSplit(ValueError):
  """A build asked for an eval split (eval_fraction > 0) whose documents give no sequences."""


def _check_output_dir(output_dir: str, overwrite: bool) -> list[str]:
  """Refuses a directory holding a dataset (unless overwrite); returns the old dataset paths."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f"--output_dir={output_dir} exists and is not a directory")
  if not os.path.isdir(output_dir):
    return []
  old = []
  for name in sorted(os.listdir(output_dir)):
    is_shard = name.endswith(".array_record") and name.split("-")[0] in data_writer.SPLITS
    if name in ("metadata.json", "tokenizer") or is_shard:
      old.append(os.path.join(output_dir, name))
  if old and not overwrite:
    raise ValueError(
      f"--output_dir={output_dir} already holds a dataset ({os.path.basename(old[0])}); "
      "pass --overwrite to replace it"
    )
  return old


def build(
  input: str | None = None,
  output_dir: str = "",
  *,
  vocab: str | None = None,
  tfds_name: str | None = None,
  tfds_data_dir: str | None = None,
  tfds_split: str = "train",
  tfds_text_key: str = "text",
  max_seq_length: int = 128,
  max_predictions_per_seq: int = 20,
  masked_lm_prob: float = 0.15,
  short_seq_prob: float = 0.1,
  dupe_factor: int = sequences.DUPE_FACTOR,
  seed: int = 12345,
  nsp: bool = True,
  packing: str = "full_sentences",
  eval_fraction: float = 0.01,
  write_masks: bool = False,
  whole_word_mask: bool = False,
  num_workers: int | None = None,
  records_per_shard: int = 100_000,
  overwrite: bool = False,
  chunk_chars: int = data_writer.CHUNK_CHARS,
  progress: bool = True,
) -> dict[str, Any]:
  """Builds a pretraining dataset in output_dir; returns the summary (also in metadata.json)."""
  from bert_jax.tokenizers.tokenizer import default_vocab_path, load_tokenizer

  t0 = time.time()
  if not output_dir:
    raise ValueError("--output_dir is required")
  if (input is None) == (tfds_name is None):
    raise ValueError("give exactly one of --input and --tfds_name")
  from bert_jax import config_schema

  config_schema.check_data_build(
    {"num_workers": num_workers, "records_per_shard": records_per_shard}
  )
  opts = sequences.Options(
    vocab=os.path.abspath(vocab) if vocab else default_vocab_path(),
    max_seq_length=max_seq_length,
    max_predictions_per_seq=max_predictions_per_seq,
    masked_lm_prob=masked_lm_prob,
    short_seq_prob=short_seq_prob,
    dupe_factor=dupe_factor,
    seed=seed,
    nsp=nsp,
    packing=packing,
    eval_fraction=eval_fraction,
    write_masks=write_masks,
    whole_word_mask=whole_word_mask,
  )
  opts.validate()
  if not os.path.exists(opts.vocab):
    raise FileNotFoundError(f"--vocab: {opts.vocab} does not exist")
  old_paths = _check_output_dir(output_dir, overwrite)
  tok = load_tokenizer(opts.vocab)
  token_dtype = records.token_dtype(tok.vocab_size)
  if input is not None:
    reader = corpus.DocumentReader(files.expand_inputs(input))
    documents = reader.documents()
    est_chars = corpus.estimate_chars(reader.files)
    input_sha256 = corpus.content_sha256(reader.files)
  else:
    reader = corpus.DocumentReader([])
    input_sha256 = None
    documents, est_chars = corpus.tfds_documents(
      tfds_name, tfds_data_dir, tfds_split, tfds_text_key
    )
  if num_workers is None:
    num_workers = os.cpu_count() or 1
  masker = data_writer.Masker(tok, opts) if write_masks else None

  created = not os.path.isdir(output_dir)  # removed again if this build fails
  os.makedirs(output_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=output_dir)
  writers = {s: data_writer.ShardWriter(tmp, s, records_per_shard) for s in data_writer.SPLITS}
  stats = collections.Counter()
  mask_kinds = collections.Counter()
  next_id = 0
  pool = None
  bar = _progress_bar(0, False)
  try:
    if num_workers <= 1:
      pool = data_writer.InProcess(opts)
    else:
      pool = data_writer.Workers(num_workers, opts)
    scatter = data_writer.Scatter(tmp, est_chars, eval_fraction, chunk_chars, seed)
    bar = _progress_bar(reader.total_bytes, progress, "reading", "B")
    scatter.scatter(documents, lambda: bar.update(reader.position(), stats))
    bar.close()
    bar = _progress_bar(sum(scatter.documents.values()), progress, "sequences", "doc")

    def units():
      for unit in itertools.chain(scatter.units("train"), scatter.units("eval")):
        stats[f"{unit.split}_chunks"] += 1
        yield unit

    # At most a few chunks in flight (memory).
    for result in pool.imap(units(), window=max(2, num_workers + 1)):
      next_id = data_writer.write_result(result, writers, next_id, masker, opts, stats, mask_kinds)
      bar.update(stats["documents"], stats)
    pool.stop()
    bar.close()
    splits = {}
    moves = []
    for split, w in writers.items():
      pairs = w.finish()
      moves += pairs
      splits[split] = {
        "files": [name for _, name in pairs],
        # What a reader checks each shard against (input_pipeline.split_files).
        "fingerprints": [records.shard_fingerprint(path) for path, _ in pairs],
        "num_sequences": w.num_records,
        "num_tokens": int(stats[f"{split}_tokens"]),
      }
    if splits["train"]["num_sequences"] == 0:
      raise ValueError(f"--input={input or tfds_name}: no sequences (no usable text)")
    if eval_fraction > 0 and splits["eval"]["num_sequences"] == 0:
      n = sum(scatter.documents.values())
      raise NoEvalSplit(
        f"--input={input or tfds_name}: {n} document{'s' * (n != 1)} (a blank line ends one), "
        f"{scatter.documents['eval']} held out by --eval_fraction={eval_fraction}, give no eval "
        "sequences: give it at least 2 documents, or pass --eval_fraction=0 to build without an "
        "eval split; nothing was written"
      )
    summary = _summary(stats, mask_kinds, reader, opts, splits, time.time() - t0, num_workers)
    metadata = {
      "format_version": records.FORMAT_VERSION,
      "max_seq_length": opts.max_seq_length,
      "nsp": opts.nsp,
      "packing": opts.layout,
      "dupe_factor": opts.dupe_factor,
      "seed": opts.seed,
      "short_seq_prob": opts.short_seq_prob,
      "eval_fraction": opts.eval_fraction,
      "max_predictions_per_seq": opts.max_predictions_per_seq,
      "masked_lm_prob": opts.masked_lm_prob,
      "token_dtype": token_dtype.name,
      "tokenizer": {
        "kind": tok.kind,
        "vocab_size": int(tok.vocab_size),
        "fingerprint": tok.fingerprint,
        "pad_id": int(tok.pad_id),
        "cls_id": int(tok.cls_id),
        "sep_id": int(tok.sep_id),
        "mask_id": int(tok.mask_id),
        "unk_id": int(tok.unk_id),
      },
      "masking": (
        dict(dataclasses.asdict(masker.cfg), seed=opts.seed) if masker is not None else None
      ),
      "splits": splits,
      "stats": summary["stats"],
      "skipped": summary["skipped"],
      "source": {
        "input": input,
        "input_sha256": input_sha256,
        "tfds_name": tfds_name,
        "vocab": opts.vocab,
      },
    }
    # This build's output, named by its content (the same command and seed: the same id).
    metadata["build_id"] = hashlib.sha256(
      json.dumps(metadata, sort_keys=True).encode()
    ).hexdigest()[:32]
    summary["build_id"] = metadata["build_id"]
    try:
      tok.save(os.path.join(tmp, "tokenizer"))
      with open(os.path.join(tmp, "metadata.json"), "w") as f:
        json.dump(metadata, f, indent=1)
    except OSError as e:
      raise data_writer.WriteError(e.errno, e.strerror or str(e)) from None
    try:
      _publish(output_dir, tmp, moves, metadata["build_id"], overwrite, summary)
    except BaseException as e:
      if getattr(e, "deferred", False):  # a signal came while it was put in place: it is whole
        e.published = True
      raise
  except data_writer.WriteError as e:  # a full disk, a quota, a file-size limit
    _abandon(pool, bar)
    raise OSError(
      f"cannot write the dataset in {output_dir}: {e.strerror}; nothing of this build is left "
      "there" + (" (the old dataset is as it was)" if old_paths else "")
    ) from None
  except BaseException:
    _abandon(pool, bar)
    raise
  finally:
    for w in writers.values():
      w.abandon()  # already closed after a success; after a failure its error is moot
    shutil.rmtree(tmp, ignore_errors=True)
    if created and not os.path.exists(os.path.join(output_dir, "metadata.json")):
      with contextlib.suppress(OSError):  # only if nothing else was put there meanwhile
        os.rmdir(output_dir)
  # What builds killed by SIGKILL left (their processes are gone): the next success clears it.
  files.remove_leftovers(output_dir, TMP_PREFIX)
  summary["output_dir"] = output_dir
  return summary


@contextlib.contextmanager
def _output_locked(output_dir: str) -> Iterator[None]:
  """An exclusive flock on the output directory itself, for publishing: two builds into one
  directory (a sweep started twice) publish one after the other. Where the file system has no
  flock, unlocked (the check under it still refuses what it sees)."""
  fd = os.open(output_dir, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
        raise
    yield
  finally:
    os.close(fd)  # the flock goes with it


def _publish(output_dir, tmp, moves, build_id: str, overwrite: bool, summary: dict) -> None:
  """Puts the finished build in place, metadata.json last, under the output directory's lock
  and in a section a signal waits for (files.uninterrupted): the output is always one build's
  whole output, never half of the old dataset and half of the new, nor the shards of one
  build and the metadata of another. A dataset that another build put there meanwhile is
  replaced only with --overwrite; if it is this very build (the same command), it is kept and
  this one dropped; any other stops this one in one line."""
  with _output_locked(output_dir), files.uninterrupted():
    present = _check_output_dir(output_dir, overwrite=True)  # what is there now
    if present and not overwrite:
      try:
        with open(os.path.join(output_dir, "metadata.json")) as f:
          other = json.load(f).get("build_id")
      except (OSError, ValueError, AttributeError):
        other = None
      if other == build_id:
        summary["identical"] = True
        return
      raise ValueError(
        f"--output_dir={output_dir}: another build put a dataset there while this one ran ("
        + (f"build {other[:12]}, not this build's {build_id[:12]}" if other else "unfinished")
        + "); nothing of this build is left; pass --overwrite to replace it"
      )
    for path in present:  # the old dataset: only its own files
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    for path, name in moves:
      os.replace(path, os.path.join(output_dir, name))
    os.replace(os.path.join(tmp, "tokenizer"), os.path.join(output_dir, "tokenizer"))
    os.replace(os.path.join(tmp, "metadata.json"), os.path.join(output_dir, "metadata.json"))


def _abandon(pool, bar) -> None:
  if pool is not None:
    pool.stop(kill=True)
  bar.close()


def _summary(stats, mask_kinds, reader, opts, splits, seconds, num_workers) -> dict[str, Any]:
  n = max(stats["sequences"], 1)
  out = {
    "documents": stats["documents"],
    "train_documents": stats["train_documents"],
    "eval_documents": stats["eval_documents"],
    "sentences": stats["sentences"],
    "sequences": stats["sequences"],
    "tokens": stats["tokens"],
    "nsp_is_next_frac": stats["is_next"] / n if opts.nsp else None,
    "short_128_frac": stats["short_128"] / n,
    "short_64_frac": stats["short_64"] / n,
    "below_max_frac": stats["below_max"] / n,
    "mean_tokens": stats["tokens"] / n,
    # What masking will select per sequence (same count rule as the original and
    # bert_jax.masking); the actual mean when --write_masks.
    "mean_masked_positions": (
      stats["masked_positions"] if opts.write_masks else stats["expected_masked_positions"]
    )
    / n,
    "pseudo_document_splits": reader.pseudo_document_splits,
    "truncated_sentences": stats["truncated_sentences"],
  }
  total_masked = sum(mask_kinds.values())
  if total_masked:
    out["masked_input_fracs"] = {k: v / total_masked for k, v in sorted(mask_kinds.items())}
  skipped = dict(reader.skipped)
  if stats["sentences_without_tokens"]:
    skipped["sentences_without_tokens"] = stats["sentences_without_tokens"]
  return {
    "stats": out,
    "skipped": skipped,
    "splits": {
      s: {k: v for k, v in d.items() if k not in ("files", "fingerprints")}
      for s, d in splits.items()
    },
    "seconds": round(seconds, 2),
    "num_workers": num_workers,
  }


class _progress_bar:  # noqa: N801 -- used like a function
  """tqdm over input bytes on stderr when available and wanted; else a line every 10 s."""

  def __init__(self, total: int, enabled: bool, desc: str = "", unit: str = "it"):
    self.enabled, self.total, self.last, self.t0 = enabled, total, 0, time.time()
    self.desc = desc
    self._last_print = self.t0
    self.bar = None
    if enabled:
      try:
        from tqdm import tqdm

        self.bar = tqdm(total=total or None, unit=unit, unit_scale=True, desc=desc, file=sys.stderr)
      except ImportError:
        pass

  def update(self, position: int, stats) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.update(max(0, position - self.last))
      self.bar.set_postfix(sequences=stats["sequences"], refresh=False)
    elif time.time() - self._last_print > 10:
      self._last_print = time.time()
      print(
        f"create_data: {self.desc} {position / max(self.total, 1):.0%}, "
        f"{stats['sequences']} sequences",
        file=sys.stderr,
      )
    self.last = position

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


def format_summary(summary: dict[str, Any]) -> str:
  s = summary["stats"]
  lines = [
    f"documents {s['documents']} (train {s['train_documents']}, eval {s['eval_documents']}), "
    f"sentences {s['sentences']}",
    f"sequences {s['sequences']} (train {summary['splits']['train']['num_sequences']}, "
    f"eval {summary['splits']['eval']['num_sequences']}), tokens {s['tokens']} "
    f"(mean {s['mean_tokens']:.1f})",
    f"shorter than 128: {s['short_128_frac']:.1%}, than 64: {s['short_64_frac']:.1%}",
    f"mean masked positions {s['mean_masked_positions']:.2f}",
  ]
  if s["nsp_is_next_frac"] is not None:
    lines.append(f"NSP is-next {s['nsp_is_next_frac']:.1%}")
  if "masked_input_fracs" in s:
    f = s["masked_input_fracs"]
    lines.append(
      f"masked inputs: [MASK] {f.get('mask', 0):.1%}, random {f.get('random', 0):.1%}, "
      f"kept {f.get('same', 0):.1%}"
    )
  if s["pseudo_document_splits"]:
    lines.append(f"documents split for size: {s['pseudo_document_splits']}")
  skipped = summary["skipped"]
  lines.append(
    "skipped: " + (", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "nothing")
  )
  lines.append(f"{summary['seconds']:.1f} s with {summary['num_workers']} workers")
  return "\n".join(lines)
