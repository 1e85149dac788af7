"""Benchmark of the trainer's own jitted train step, side by side with HuggingFace/PyTorch.

`python -m bert_jax.benchmark` (`__main__.py`) runs it. One module per job:

  step.py         our measurement: `train.jit_train_step` on `train.create_state`'s state,
                  tokens/s, MFU against a matmul peak measured in the same process, page faults
  finetune_step.py  `--task=finetune`: the fine-tuning engine's step (2-way classification)
  peers.py        the HF Flax / PyTorch peers: which an interpreter can run, their records
  peer_worker.py  the peer's step, a script the peer interpreter runs by path (no bert_jax)
  lockstep.py     ours and a peer in live processes taking turns of whole steps
  suite.py        the interleaved suite of fresh-process measurements, JSON lines
  tables.py       summaries (best dtype vs fastest peer) and markdown tables
  host.py         CPU bf16 support, glibc's huge-page malloc tunable, /proc readings, matmul peak
  protocol.py     the line protocol between the benchmark and its worker processes
  batches.py      the synthetic batch both sides time (numpy only: the peer loads it by path)
  sizes.py        model.SIZES plus 'minilm' (6 x 384, 12 heads), fine-tuning step FLOPs
  memory.py       BERT-Large's compile time and XLA's memory accounting
  data.py         create_data and input-pipeline throughput
  gpu.py          `--gpu`: ours against PyTorch on one GPU, in one planned command (docs/gpu.md)
  gpu_plan.py     its plans, estimates and admission against the deadline (`--dry_run`)
  gpu_ours.py     its worker for our steps: abstract lowering, compile threads, timing
  profile.py      one traced step as device time per kernel family and the top kernels

Every measurement runs in a fresh interpreter (so compile time and peak RSS are its own) and
the measurements of one pass are interleaved (ours, then each peer, size by size), so the
ratios of a pass are taken under the same machine conditions. Without `--variants` ours is the
trainer's default model (`kernels='auto'`: the CPU kernels on the CPU backend). Every measured
process, ours and the peers', starts with glibc's malloc on transparent huge pages
(`--thp_malloc`, where the kernel offers THP): each step allocates its activations afresh, and
4 KB pages cost a BERT-Base step over a million page faults. bf16 (ours and the peers') is
timed by default only where the CPU has AVX512-BF16 or AMX; elsewhere it is emulated.

`--task=finetune` times one fine-tuning train step instead (the engine's, AdamW with its
schedule and clipping, on a 2-way classifier over the pooled [CLS]) against transformers'
PyTorch BertForSequenceClassification (SDPA attention) eager and torch.compile, in the same
dtype policy, on the same arrays; the tables count examples/s.
"""
