"""The one base config every file in configs/ and experiments/ starts from, and the `:ARG`
parser. Keys of `config.model` are `BertConfig` fields (`causal` follows the LTR objective)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections
from ml_collections import config_dict

from bert_jax import model_config
from bert_jax import sharding as sh
from bert_jax.data import sequences


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """'size=small,nsp=False' (or a bare first value for the first key) -> ConfigDict.

  Values are converted to the type of their default; unknown keys are errors.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  keys = list(defaults)
  for i, item in enumerate(arg.split(",")):
    if not item:
      continue
    if "=" in item:
      key, value = item.split("=", 1)
    elif i == 0 and keys:
      key, value = keys[0], item
    else:
      key, value = item, "True"
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; known: {', '.join(keys)}")
    default = defaults[key]
    if isinstance(default, bool):
      if value not in ("True", "False", "true", "false", "1", "0"):
        raise ValueError(f"config argument {key}={value!r} is not a bool")
      out[key] = value in ("True", "true", "1")
    elif default is None:
      out[key] = value
    else:
      try:
        out[key] = type(default)(value)
      except ValueError:
        raise ValueError(
          f"config argument {key}={value!r} is not a {type(default).__name__}"
        ) from None
  return out


BUNDLED_CORPUS = os.path.join(os.path.dirname(__file__), "data", "sample_public_domain.txt")


def cpu_has_bf16() -> bool:
  """Whether this (Linux x86) CPU has bf16 matmul instructions (AVX512-BF16 or AMX-BF16); where
  it has not, XLA:CPU emulates bf16, slower than float32 (the CPU configs' dtype rule)."""
  try:
    with open("/proc/cpuinfo") as f:
      flags = f.read()
  except OSError:
    return False
  return "avx512_bf16" in flags or "amx_bf16" in flags


SCALES = ("full", "cpu", "gpu")
# The reduced scales' recipe (docs/notes/budget.md): BERT-tiny with a 4,096-entry
# WordPiece vocab trained on the pretraining text (tools/replication/build_data.sh: the first
# 2 MB of the 62 MB corpus, one narrow domain), no dropout, a larger initializer range, batch
# 16 x 64 (a tiny BERT leaves the unigram plateau sooner on short sequences than on 128-token
# ones, and later at batch 8).
SCALED_VOCAB = 4096
SCALED_BATCH = 16
SCALED_LENGTH = 64
SCALED_PREDICTIONS = 10  # 15% of 64
# Pretraining steps per point: cpu, 12.3M tokens, where the MLM + NSP point passes the
# count-based reference (docs/notes/budget.md); gpu, at least 20M tokens
# (tools/replication/replicate_gpu.sh).
SCALED_STEPS = {"cpu": 12_000, "gpu": 20_480}
# Pretraining runs per compared point (an ablation's unit of variance: a verdict needs several;
# bert_jax/report/stats.py calls one run inconclusive).
PRETRAINING_SEEDS = 3


def pretraining_seed(c: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """`c` pretrained with seed `seed` (0: unchanged): what is random in a run that its data does
  not fix, the initialisation (`seed`) and the order training sequences are read in
  (`data.seed`), the two seeds MultiBERTs (Sellam et al. 2022) vary. The data (segmentation,
  pairs, static masks) and the held-out eval masks stay those of every other seed, so every run
  is scored on the same targets."""
  if seed < 0:
    raise ValueError(f"seed must be >= 0, not {seed}")
  c.seed += seed
  c.data.seed += seed
  return c


def scaled_base(
  scale: str, size: str = "tiny", steps: int | None = None
) -> ml_collections.ConfigDict:
  """The base of every experiment and of configs/local.py. full: BERT-Base as in the paper.
  cpu and gpu: the tiny model (or `size`) at SCALED_STEPS[scale] steps (or `steps`) of 16 x 64
  tokens (cpu 12.3M tokens, gpu 21M), on the bundled corpus unless the experiment's data=
  names a corpus built with a vocab of SCALED_VOCAB (tools/replication/replicate_cpu.sh builds
  one)."""
  if scale == "full":
    return base_config("base")
  if scale not in SCALES:
    raise ValueError(f"scale must be one of {', '.join(SCALES)}, not {scale!r}")
  c = base_config(size)
  c.model.vocab_size = c.data.train_vocab_size = SCALED_VOCAB
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  c.model.initializer_range = 0.05
  c.model.dtype = "bfloat16" if scale == "gpu" or cpu_has_bf16() else "float32"
  c.data.input = BUNDLED_CORPUS
  # One copy of the corpus, read several times by the budget: a static mask comes back with
  # its sequence (the masking experiment's contrast), as in BERT's own 40 epochs.
  c.data.dupe_factor = 1
  c.data.eval_fraction = 0.05
  c.data.batch_size = SCALED_BATCH
  c.data.max_seq_length = SCALED_LENGTH
  c.masking.max_predictions = SCALED_PREDICTIONS
  c.opt.lr = 1.4e-3
  c.opt.total_steps = steps or SCALED_STEPS[scale]
  c.opt.warmup_steps = max(1, c.opt.total_steps // 20)
  c.ckpt.every_steps = max(1, c.opt.total_steps // 2)
  c.eval.every_steps = max(1, c.opt.total_steps // 4)
  c.log.every_steps = max(1, c.opt.total_steps // 60)
  return c


def use_data(c: ml_collections.ConfigDict, data: str) -> ml_collections.ConfigDict:
  """An experiment's `data=DIR` argument: DIR holds two create_data outputs of one corpus,
  DIR/nsp (sentence pairs) and DIR/packed (--nsp=False), built once and shared by every point
  (tools/replication/build_data.sh); a point reads the one its objective needs, with the
  data's vocab. Empty: the config's own data.dir / data.input."""
  if data:
    c.data.dir = os.path.join(data, "nsp" if c.objective.nsp else "packed")
    c.data.train_vocab_size = 0
  return c


def pretraining_phase(c: ml_collections.ConfigDict, phase: int) -> ml_collections.ConfigDict:
  """The paper's two phases: 900k steps at length 128, then 100k at 512 (80 predictions)."""
  if phase == 1:
    c.opt.total_steps = 900_000
  elif phase == 2:
    c.data.max_seq_length = 512
    c.masking.max_predictions = 80
    c.opt.total_steps = 100_000
    c.opt.warmup_steps = 1_000
  else:
    raise ValueError(f"phase must be 1 or 2, not {phase}")
  return c


def base_config(size: str = "base") -> ml_collections.ConfigDict:
  """BERT's recipe (Devlin et al. 2019, A.2) for the given model size."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Weights (only) of any checkpoint bert_jax.load reads: another run (e.g. phase 1 at seq 128
  # for phase 2 at 512), a HuggingFace or Google BERT, a params dir. Heads missing: fresh.
  c.init_from = config_dict.placeholder(str)
  # A resume refuses changes that would make it differ from the uninterrupted run (optimizer,
  # schedule, batch, model, masking, seeds: each named with both values; see
  # bert_jax/runtime/resume.py)
  # unless listed here, comma-separated: fields ('opt.lr'), sections ('opt'), 'tokenizer' (the
  # data's tokenizer fingerprint, also for init_from), 'dataset' (the data's options) or '*'.
  c.resume_allow_changes = ""

  fields = {f.name: f.default for f in dataclasses.fields(model_config.BertConfig)}
  fields.pop("causal")  # derived from objective.ltr
  fields.pop("platform")  # set by model.resolve_kernels for the devices a run uses
  fields.update(model_config.size_fields(size))
  c.model = ml_collections.ConfigDict(fields)

  c.objective = ml_collections.ConfigDict(dict(mlm=True, nsp=True, ltr=False))

  c.masking = ml_collections.ConfigDict()
  c.masking.mode = "static"  # static: mask fixed per example id (BERT) | dynamic (RoBERTa)
  c.masking.seed = 0
  c.masking.max_predictions = 20
  c.masking.prob = 0.15
  c.masking.whole_word = False

  c.data = ml_collections.ConfigDict()
  c.data.dir = config_dict.placeholder(str)  # a create_data output directory
  # Or text to build from on first use (into <workdir>/data); the vocab defaults to BERT's.
  c.data.input = ""
  c.data.vocab = ""
  # Or > 0: train a WordPiece vocab of this size on data.input first (= model.vocab_size).
  c.data.train_vocab_size = 0
  c.data.max_seq_length = 128
  c.data.dupe_factor = sequences.DUPE_FACTOR  # 1, create_data's default too
  c.data.short_seq_prob = 0.1
  c.data.eval_fraction = 0.01
  c.data.seed = 12345
  c.data.batch_size = 256  # global, in sequences
  c.data.worker_count = 0  # grain worker processes per host

  c.opt = ml_collections.ConfigDict()
  c.opt.name = "adamw"  # adamw | lamb
  c.opt.lr = 1e-4
  c.opt.b1 = 0.9
  c.opt.b2 = 0.999
  c.opt.eps = 1e-6
  c.opt.weight_decay = 0.01  # not on LayerNorm or biases
  c.opt.warmup_steps = 10_000
  c.opt.total_steps = 1_000_000
  c.opt.clip_norm = 1.0
  c.opt.grad_accum_steps = 1
  # A step whose update is not finite (gradient, new parameters or optimizer state; a finite
  # loss can have one): 'stop' leaves the state unchanged and stops naming the step; 'skip'
  # leaves params and optimizer state unchanged, counts it (train/skipped_steps) and goes on,
  # until max_consecutive_skips steps in a row end the run. No NaN state is ever saved.
  c.opt.nonfinite = "stop"
  c.opt.max_consecutive_skips = 10

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (1, -1, 1)  # (data, fsdp, tensor); one -1 takes the remaining devices
  # Logical axis -> mesh axes; the comments on each rule live in bert_jax/sharding.py.
  c.mesh.rules = tuple(sh.DEFAULT_RULES)

  c.ckpt = ml_collections.ConfigDict()
  c.ckpt.every_steps = 10_000
  c.ckpt.keep = 2
  c.ckpt.async_save = True

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 50_000
  c.eval.batch_size = config_dict.placeholder(int)  # default: data.batch_size
  c.eval.max_batches = config_dict.placeholder(int)  # default: the whole eval split

  c.log = ml_collections.ConfigDict()
  c.log.every_steps = 100
  c.log.peak_flops = config_dict.placeholder(float)  # per device; known TPUs/GPUs built in
  c.log.fill_mask = ()  # texts with [MASK] whose predictions are printed at the end
  return c
