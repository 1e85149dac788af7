"""Writes the HuggingFace golden fixtures in tests/fixtures/hf/ (needs torch + transformers).

    /work/venv-ref/bin/python scripts/make_hf_fixtures.py      # torch 2.13 CPU, transformers 4.57.6

For each tiny config: a random-weight `transformers.BertForPreTraining` (every tensor random,
LayerNorm scales around 1, so a transposed or misplaced tensor changes the outputs), saved with
`save_pretrained` (config.json + model.safetensors, exactly what HF writes), plus io.safetensors
with padded inputs and HF's fp32 outputs: sequence_output, pooled_output, mlm_logits (every
position) and nsp_logits. tests/test_convert.py checks bert_jax against these without torch.
"""

import pathlib
import shutil

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"

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


def randomise(model: torch.nn.Module, seed: int) -> None:
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      if "LayerNorm.weight" in name:
        p.copy_(1.0 + 0.2 * noise)
      else:
        p.copy_(0.2 * noise)
  model.tie_weights()


def inputs(cfg: transformers.BertConfig, lengths: tuple[int, ...], seed: int):
  rng = np.random.default_rng(seed)
  length = max(lengths)
  ids = rng.integers(1, cfg.vocab_size, (len(lengths), length)).astype(np.int32)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
  seg = np.zeros_like(ids)
  for b, n in enumerate(lengths):
    seg[b, n // 2 : n] = 1 + b % (cfg.type_vocab_size - 1)
  return ids * mask, seg, mask  # pads are id 0, segment 0


def main() -> None:
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


if __name__ == "__main__":
  main()
