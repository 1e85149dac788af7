"""Writes the HuggingFace golden fixtures in tests/fixtures/hf/ (needs torch + transformers).

    /work/venv-ref/bin/python scripts/make_hf_fixtures.py      # torch 2.13 CPU, transformers 4.57.6

and, for the round trip (tests/test_interop.py), first with bert_jax's own environment:

    python scripts/make_hf_fixtures.py --export   # pretrain, convert: tests/fixtures/hf/roundtrip
    /work/venv-ref/bin/python scripts/make_hf_fixtures.py --record   # transformers' outputs on it

`--export` pretrains the bundled default (configs/local.py, shrunk by `roundtrip_config`) for a
few steps, converts the workdir with `bert_jax.convert` (weights + tokenizer in HuggingFace's
files) and stores the trainer's first masked MLM+NSP batch on data built with that vocab.
`--record` writes hf_reference.json (from_pretrained's loading info, fill-mask pipeline top-5,
a digest of AutoTokenizer's ids on every corpus line, the MLM+NSP loss on the stored batch) and
hf_hidden.safetensors (BertModel hidden states of EMBED_TEXTS). The test compares bert_jax
against these without torch, and reruns `hf_reference` live when torch is importable.

For each tiny config: a random-weight `transformers.BertForPreTraining` (every tensor random,
LayerNorm scales around 1, so a transposed or misplaced tensor changes the outputs), saved with
`save_pretrained` (config.json + model.safetensors, exactly what HF writes), plus io.safetensors
with padded inputs and HF's fp32 outputs: sequence_output, pooled_output, mlm_logits (every
position) and nsp_logits. tests/test_convert.py checks bert_jax against these without torch.
"""

import hashlib
import json
import pathlib
import shutil
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "hf"
ROUNDTRIP = OUT / "roundtrip"
CORPUS = REPO / "bert_jax" / "data" / "sample_public_domain.txt"
FILL_MASK_TEXTS = (
  "alice was beginning to get very tired of sitting by her [MASK] on the bank .",
  "the king and [MASK] of hearts were seated on their throne .",
  "the president of the united [MASK] addressed the [MASK] .",
)
EMBED_TEXTS = ("the queen said to alice", "a short one .", "the united states of america")
BATCH_KEYS = ("input_ids", "segment_ids", "input_mask", "positions", "targets", "target_weights")

CONFIGS = {
  # name: (HF config fields, batch, length, row lengths)
  "l2_h32_a4": (
    dict(
      vocab_size=100,
      hidden_size=32,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=64,
      max_position_embeddings=16,
      type_vocab_size=2,
    ),
    (10, 6),
  ),
  "l3_h24_a3": (
    dict(
      vocab_size=300,
      hidden_size=24,
      num_hidden_layers=3,
      num_attention_heads=3,
      intermediate_size=40,
      max_position_embeddings=20,
      type_vocab_size=3,
    ),
    (12, 12, 4),
  ),
  "l1_h16_a2_causal": (
    dict(
      vocab_size=640,
      hidden_size=16,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=96,
      max_position_embeddings=24,
      type_vocab_size=2,
      is_decoder=True,
    ),
    (9, 5),
  ),
}


def randomise(model, seed: int) -> None:
  import torch

  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      if "LayerNorm.weight" in name:
        p.copy_(1.0 + 0.2 * noise)
      else:
        p.copy_(0.2 * noise)
  model.tie_weights()


def inputs(cfg, lengths: tuple[int, ...], seed: int):
  rng = np.random.default_rng(seed)
  length = max(lengths)
  ids = rng.integers(1, cfg.vocab_size, (len(lengths), length)).astype(np.int32)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
  seg = np.zeros_like(ids)
  for b, n in enumerate(lengths):
    seg[b, n // 2 : n] = 1 + b % (cfg.type_vocab_size - 1)
  return ids * mask, seg, mask  # pads are id 0, segment 0


def main() -> None:
  import torch
  import transformers

  for seed, (name, (fields, lengths)) in enumerate(CONFIGS.items()):
    cfg = transformers.BertConfig(**fields, attn_implementation="eager")
    model = transformers.BertForPreTraining(cfg).eval()
    randomise(model, seed)
    ids, seg, mask = inputs(cfg, lengths, seed)
    with torch.no_grad():
      t = lambda x: torch.from_numpy(x).long()
      out = model(
        input_ids=t(ids), token_type_ids=t(seg), attention_mask=t(mask), output_hidden_states=True
      )
      pooled = model.bert.pooler(out.hidden_states[-1])
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    save_file(
      {
        "input_ids": ids,
        "segment_ids": seg,
        "input_mask": mask,
        "sequence_output": out.hidden_states[-1].numpy(),
        "pooled_output": pooled.numpy(),
        "mlm_logits": out.prediction_logits.numpy(),
        "nsp_logits": out.seq_relationship_logits.numpy(),
      },
      str(d / "io.safetensors"),
    )
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{name}: {size / 1024:.0f} KB")


# --- The round trip: a bert_jax run exported to HuggingFace --------------------------------


def roundtrip_config(steps: int = 300, data_dir: str | None = None, nsp: bool = False):
  """configs/local.py (the bundled default), shrunk so the export stays well under 1 MB."""
  import importlib.util

  spec = importlib.util.spec_from_file_location("local_config", REPO / "configs" / "local.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"steps={steps}")
  # The recipe the fixtures were recorded with (the default's before it changed), in float32
  # on every host (the default computes in bf16 where the CPU has it; the export is float32).
  c.model.dtype = "float32"
  c.data.batch_size, c.opt.lr, c.model.initializer_range = 8, 1e-3, 0.02
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.1
  c.model.hidden_size = 32
  c.model.intermediate_size = 64
  c.data.dupe_factor = 1
  c.eval.max_batches = 1
  c.ckpt.async_save = False
  c.log.fill_mask = ()
  if data_dir:
    c.data.dir, c.data.input, c.data.train_vocab_size = data_dir, None, None
  if nsp:
    c.objective.nsp = True
    c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
    c.opt.total_steps, c.opt.warmup_steps, c.log.every_steps = 1, 0, 1
  return c


def build_nsp_data(vocab: str, out: str) -> str:
  """MLM+NSP pairs of the bundled corpus under `vocab` (for continued pretraining)."""
  from bert_jax import pretraining_data

  options = {"max_seq_length": 64, "max_predictions_per_seq": 10, "eval_fraction": 0.05}
  pretraining_data.build(str(CORPUS), out, vocab=vocab, num_workers=1, progress=False, **options)
  return out


def first_batch(config, data_dir: str) -> dict[str, np.ndarray]:
  """The trainer's first masked batch for `config` (same pipeline, seed and masking)."""
  import jax

  from bert_jax import masking, objectives, train
  from bert_jax import tokenizer as tokenizer_lib

  ds = train.train_dataset(config, data_dir, worker_count=0)
  batch = next(iter(ds))
  tables = masking.tables_from_tokenizer(tokenizer_lib.load_tokenizer(f"{data_dir}/tokenizer"))
  obj = objectives.Objective.from_config(config)
  prepared = jax.jit(lambda b: objectives.prepare(b, obj, tables))(batch)
  out = {k: np.asarray(prepared[k]) for k in BATCH_KEYS}
  out["next_sentence_label"] = np.asarray(prepared["next_sentence_label"])
  return out


def export() -> None:
  from bert_jax import interop, train

  with tempfile.TemporaryDirectory() as tmp:
    workdir = f"{tmp}/workdir"
    train.train_and_evaluate(roundtrip_config(), workdir)
    shutil.rmtree(ROUNDTRIP, ignore_errors=True)
    interop.convert(workdir, ROUNDTRIP)
    config = roundtrip_config(nsp=True)
    data = build_nsp_data(str(ROUNDTRIP / "vocab.txt"), f"{tmp}/nsp")
    save_file(first_batch(config, data), str(ROUNDTRIP / "batch.safetensors"))
  for f in sorted(ROUNDTRIP.iterdir()):
    print(f"{f.name}: {f.stat().st_size / 1024:.0f} KB")


def ids_digest(encode, path=CORPUS) -> str:
  """sha256 over every corpus line's ids (no [CLS]/[SEP]), one JSON list a line."""
  h = hashlib.sha256()
  with open(path, encoding="utf-8") as f:
    for line in f:
      h.update((json.dumps(list(encode(line.rstrip("\n")))) + "\n").encode())
  return h.hexdigest()


def hf_reference(hf_dir) -> tuple[dict, dict[str, np.ndarray]]:
  """transformers on an exported dir: loading info, fill-mask top-5, corpus id digest, the
  MLM+NSP loss on batch.safetensors (fp32, dropout off) and BertModel hidden states."""
  import torch
  import transformers

  hf_dir = pathlib.Path(hf_dir)
  model, info = transformers.BertForPreTraining.from_pretrained(
    hf_dir, output_loading_info=True, attn_implementation="eager"
  )
  model.eval()
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
  fill = transformers.pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir), top_k=5)
  preds = []
  for text in FILL_MASK_TEXTS:
    out = fill(text)
    out = out if isinstance(out[0], list) else [out]  # one list per [MASK]
    preds.append([[[int(p["token"]), float(p["score"])] for p in per] for per in out])
  ref = {
    "loading_info": {k: list(v) for k, v in info.items()},
    "tokenizer_class": type(tok).__name__,
    "fill_mask": preds,
    "ids_digest": ids_digest(lambda t: tok(t, add_special_tokens=False)["input_ids"]),
  }
  hidden = {}
  with torch.no_grad():
    enc = tok(list(EMBED_TEXTS), padding=True, return_tensors="pt")
    states = model.bert(**enc, output_hidden_states=True).hidden_states
    for i, n in enumerate(enc["attention_mask"].sum(1).tolist()):
      hidden[f"text_{i}"] = torch.stack([h[i, :n] for h in states]).numpy()
    batch_path = hf_dir / "batch.safetensors"
    if batch_path.is_file():
      b = {k: torch.from_numpy(v).long() for k, v in load_file(str(batch_path)).items()}
      labels = torch.full_like(b["input_ids"], -100)
      for row in range(labels.shape[0]):
        cols = (b["positions"][row], b["targets"][row], b["target_weights"][row])
        for pos, target, w in zip(*cols, strict=True):
          if w:
            labels[row, pos] = target
      out = model(
        input_ids=b["input_ids"],
        token_type_ids=b["segment_ids"],
        attention_mask=b["input_mask"],
        labels=labels,
        next_sentence_label=b["next_sentence_label"],
      )
      ref["mlm_nsp_loss"] = float(out.loss)
  return ref, hidden


def record() -> None:
  ref, hidden = hf_reference(ROUNDTRIP)
  (ROUNDTRIP / "hf_reference.json").write_text(json.dumps(ref, indent=1) + "\n")
  save_file(hidden, str(ROUNDTRIP / "hf_hidden.safetensors"))
  print(json.dumps({k: v for k, v in ref.items() if k != "fill_mask"}, indent=1))


if __name__ == "__main__":
  {"--export": export, "--record": record}.get(sys.argv[1] if len(sys.argv) > 1 else "", main)()
