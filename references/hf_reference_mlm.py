"""HuggingFace PyTorch BertForPreTraining (BERT-tiny size, AdamW 1e-3, 10% warmup, linear
decay, clip 1.0) trained on the batches of references/dump_masked_batches.py; prints held-out MLM
accuracy and accuracy at [MASK]. Needs torch + transformers (setup.py extra `peers`).

  python references/hf_reference_mlm.py --batches=DIR --lr=1e-3 --vocab_size=4096  # [MASK]: id 4
"""

import argparse
import os

import numpy as np
import torch
from transformers import BertConfig, BertForPreTraining

ap = argparse.ArgumentParser()
ap.add_argument("--batches", required=True, help="dump_masked_batches.py's --out directory")
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--vocab_size", type=int, default=4096)
a = ap.parse_args()
torch.manual_seed(0)
torch.set_num_threads(2)
tr = np.load(os.path.join(a.batches, "batches_train.npz"))
ev = np.load(os.path.join(a.batches, "batches_eval.npz"))
lr = a.lr
cfg = BertConfig(
  vocab_size=a.vocab_size,
  hidden_size=128,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=512,
  max_position_embeddings=512,
)
m = BertForPreTraining(cfg)
nd = ["bias", "LayerNorm.weight"]
groups = [
  {
    "params": [p for n, p in m.named_parameters() if not any(x in n for x in nd)],
    "weight_decay": 0.01,
  },
  {"params": [p for n, p in m.named_parameters() if any(x in n for x in nd)], "weight_decay": 0.0},
]
opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
N = tr["input_ids"].shape[0]
W = N // 10
sched = torch.optim.lr_scheduler.LambdaLR(
  opt, lambda s: s / W if s < W else max(0.0, (N - s) / (N - W))
)


def batch(d, i):
  ids = torch.tensor(d["input_ids"][i], dtype=torch.long)
  labels = torch.full_like(ids, -100)
  w = d["target_weights"][i] > 0
  for b in range(ids.shape[0]):
    for p, t, ww in zip(d["positions"][i][b], d["targets"][i][b], w[b], strict=True):
      if ww:
        labels[b, p] = int(t)
  return (
    dict(
      input_ids=ids,
      token_type_ids=torch.tensor(d["segment_ids"][i], dtype=torch.long),
      attention_mask=torch.tensor(d["input_mask"][i], dtype=torch.long),
    ),
    labels,
    torch.tensor(d["next_sentence_label"][i], dtype=torch.long),
  )


def evaluate():
  m.eval()
  c = n = cm = nm = 0
  with torch.no_grad():
    for i in range(ev["input_ids"].shape[0]):
      x, labels, _ = batch(ev, i)
      if x["attention_mask"].sum() == 0:
        continue
      pred = m(**x).prediction_logits.argmax(-1)
      sel = labels != -100
      c += (pred[sel] == labels[sel]).sum().item()
      n += sel.sum().item()
      ms = sel & (x["input_ids"] == 4)
      cm += (pred[ms] == labels[ms]).sum().item()
      nm += ms.sum().item()
  m.train()
  return c / n, cm / max(nm, 1), n


for s in range(N):
  x, labels, nsp = batch(tr, s)
  out = m(**x, labels=labels, next_sentence_label=nsp)
  out.loss.backward()
  torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
  opt.step()
  sched.step()
  opt.zero_grad()
  if (s + 1) % 800 == 0:
    print(s + 1, round(out.loss.item(), 3), "eval acc / acc at [MASK] / n", evaluate(), flush=True)
