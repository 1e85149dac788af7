"""bert_jax.ngram_reference: the vectorised counts against a plain-Python reading of the same
rules, hand-checked back-offs, and the trainer's final eval row and line."""

import collections
import json
import subprocess
import sys

import numpy as np

from bert_jax import ngram_reference as ng

V = 12


def _seqs(rng, n=40, length=10):
  ids = rng.integers(4, V, size=(n, length))
  mask = np.zeros((n, length), np.int32)
  for i, k in enumerate(rng.integers(3, length + 1, size=n)):
    mask[i, :k] = 1
  return ids, mask


def _plain(ids, mask):
  """The reference's rules with Counters (ties to the smallest token), as the spec."""
  uni, left, right, pair, nxt = (collections.Counter() for _ in range(5))
  for row, m in zip(ids, mask, strict=True):
    t = row[m.astype(bool)].tolist()
    for i in range(1, len(t) - 1):
      uni[t[i]] += 1
      left[(t[i - 1], t[i])] += 1
      right[(t[i + 1], t[i])] += 1
      pair[(t[i - 1], t[i + 1], t[i])] += 1
      nxt[(t[i - 1], t[i], t[i + 1])] += 1

  def best(counter, prefix, n):
    cands = [(k[n], c) for k, c in counter.items() if k[:n] == prefix]
    return min(cands, key=lambda wc: (-wc[1], wc[0]))[0] if cands else None

  top = min(uni, key=lambda w: (-uni[w], w))

  def masked(lft, rgt):
    b = best(pair, (lft, rgt), 2)
    if b is not None:
      return b
    ls = {k[1]: c for k, c in left.items() if k[0] == lft}
    rs = {k[1]: c for k, c in right.items() if k[0] == rgt}
    both = sorted(set(ls) & set(rs))
    if both:
      return max(both, key=lambda w: ls[w] * rs[w] / uni[w])
    b = best(left, (lft,), 1)
    return top if b is None else b

  def following(before, last):
    b = best(nxt, (before, last), 2) if before is not None else None
    if b is not None:
      return b
    b = best(left, (last,), 1)
    return top if b is None else b

  return masked, following


def test_counts_match_the_plain_rules():
  rng = np.random.default_rng(0)
  ids, mask = _seqs(rng)
  c = ng.count(iter([(ids[:25], mask[:25]), (ids[25:], mask[25:])]), V)
  masked, following = _plain(ids, mask)
  for lft in range(V):
    for rgt in range(V):
      assert ng.predict_masked(c, lft, rgt) == masked(lft, rgt), (lft, rgt)
      assert ng.predict_next(c, lft, rgt) == following(lft, rgt), (lft, rgt)
    assert ng.predict_next(c, None, lft) == following(None, lft)
  # Scoring a batch: [MASK] (id 1) targets guessed from their neighbours, others copied.
  inputs = ids.copy()
  positions = np.array([[1, 4, 7]] * len(ids))
  shown_mask = rng.random(positions.shape) < 0.7
  for s_, row in enumerate(positions):
    inputs[s_, row[shown_mask[s_]]] = 1
  targets, weights = ids[np.arange(len(ids))[:, None], positions], rng.random(positions.shape) < 0.9
  want = [0, 0, 0, 0]
  for s_, j in zip(*np.nonzero(weights), strict=True):
    i = positions[s_, j]
    at = inputs[s_, i] == 1
    guess = masked(inputs[s_, i - 1], inputs[s_, i + 1]) if at else inputs[s_, i]
    want[0] += guess == targets[s_, j]
    want[1] += 1
    want[2] += at and guess == targets[s_, j]
    want[3] += at
  assert ng.score_mlm(c, inputs, positions, targets, weights, 1) == tuple(want)
  ltr_w = mask.copy()
  ltr_w[:, -1] = 0
  want_ltr = sum(
    following(ids[s_, t - 1] if t else None, ids[s_, t]) == ids[s_, t + 1]
    for s_, t in zip(*np.nonzero(ltr_w), strict=True)
  )
  assert ng.score_ltr(c, ids, np.roll(ids, -1, 1), ltr_w) == (want_ltr, int(ltr_w.sum()))


def test_back_off_order_by_hand():
  # Sequences (mask all ones): a b c, a d c, x d y, a d z.
  a, b, c_, d, x, y, z = range(4, 11)
  ids = np.array([[a, b, c_], [a, d, c_], [x, d, y], [a, d, z]])
  c = ng.count(iter([(ids, np.ones_like(ids))]), V)
  assert ng.predict_masked(c, a, c_) == b  # (a, c) seen twice, b and d once each: smaller id
  assert ng.predict_masked(c, x, z) == d  # unseen pair: left x -> d, right z <- d
  assert ng.predict_masked(c, a, a) == d  # nothing has a right neighbour a: left bigram a -> d
  assert ng.predict_masked(c, 2, 3) == d  # nothing at all: the most frequent middle token
  assert ng.predict_next(c, a, d) == c_  # (a, d) -> c once, z once: the smaller id
  assert ng.predict_next(c, y, a) == d  # unseen pair: the bigram a -> d
  # A [MASK] (id 1) is guessed from its neighbours; a shown token is copied.
  inputs = np.array([[a, 1, c_, x]])
  positions, targets = np.array([[1, 3]]), np.array([[b, d]])
  assert ng.score_mlm(c, inputs, positions, targets, np.ones((1, 2)), 1) == (1, 2, 1, 1)


def test_trainer_prints_and_records_the_reference(tiny_data_dir, tmp_path, capsys):
  """The final eval line and metrics.jsonl's final eval row hold the reference that the CLI
  computes again."""
  from bert_jax import train
  from unit.test_train import tiny_config

  c = tiny_config(tiny_data_dir, **{"opt.total_steps": 2, "eval.max_batches": 2})
  out = train.train_and_evaluate(c, str(tmp_path))
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  (ev,) = [r for r in rows if r["split"] == "eval"]
  assert ev["step"] == 2 and 0.05 < ev["mlm_reference_accuracy"] < 0.6
  assert 0.0 < ev["mlm_reference_accuracy_at_mask"] < ev["mlm_reference_accuracy"]
  assert out["eval"]["mlm_reference_accuracy"] == ev["mlm_reference_accuracy"]
  printed = capsys.readouterr().out
  assert (
    f"eval @ 2: mlm_accuracy {ev['mlm_accuracy']:.4f} against the count-based reference's "
    f"{ev['mlm_reference_accuracy']:.4f} on the same targets (at [MASK]: "
    f"{ev['mlm_accuracy_at_mask']:.4f} against {ev['mlm_reference_accuracy_at_mask']:.4f})"
  ) in printed
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.ngram_reference", str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 0, r.stderr
  assert f"mlm_reference_accuracy {ev['mlm_reference_accuracy']:.4f}" in r.stdout


def test_cli_errors(tmp_path):
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.ngram_reference", str(tmp_path / "nowhere")],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 1 and r.stderr.startswith("ngram_reference: error: ")
  assert len(r.stderr.strip().splitlines()) == 1
  r = subprocess.run(
    [sys.executable, "-m", "bert_jax.ngram_reference"], capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 2 and "usage" in r.stderr
