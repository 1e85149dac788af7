"""Tests for bert_jax.tasks.readers (fixtures in fixtures/tasks; encoding: test_tasks_encode.py)."""

import json
import pathlib
import re

import numpy as np
import pytest
from ml_collections import ConfigDict

from bert_jax.tasks import encode as encode_lib
from bert_jax.tasks import readers
from bert_jax.tasks.formats import TaggedExample, TextExample
from bert_jax.tokenizers import tokenizer as tokenizer_lib

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "tasks"
GENERIC = FIXTURES / "generic"
GLUE_DIR = FIXTURES / "glue"
CLS, SEP, PAD, UNK = 101, 102, 0, 100


def make_task(**overrides) -> ConfigDict:
  """A config.task as the fine-tuning config defines it."""
  task = dict(
    name="custom",
    kind="classification",
    format="auto",
    train="",
    dev="",
    test="",
    text_fields=("sentence",),
    label_field="label",
    labels=(),
    tokens_field="tokens",
    tags_field="tags",
    word_column=0,
    tag_column=-1,
    glue_dir="",
    tfds_data_dir="",
    max_examples=0,
  )
  task.update(overrides)
  return ConfigDict(task)


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer(tokenizer_lib.default_vocab_path())


# --- Generic formats -----------------------------------------------------------------------


def test_jsonl_pairs_in_file_order_with_sources():
  path = str(GENERIC / "pairs.jsonl")
  task = make_task(train=path, text_fields=("premise", "hypothesis"))
  examples = readers.read_split(task, "train")
  assert examples == [
    TextExample(("A man is playing a guitar.", "Someone makes music."), "entailment", f"{path}:1"),
    TextExample(("The cat sat.", "A dog ran."), "contradiction", f"{path}:2"),
    TextExample(("Paris is nice", "hello world"), "neutral", f"{path}:4"),  # line 3 is blank
  ]
  assert readers.label_list(task, examples) == ["contradiction", "entailment", "neutral"]
  assert readers.label_list(make_task(labels=("x", "y")), examples) == ["x", "y"]


def test_csv_quoted_fields_and_multiline_rows():
  path = str(GENERIC / "pairs.csv")
  task = make_task(train=path, text_fields=("premise", "hypothesis"))
  examples = readers.read_split(task, "train")
  assert [ex.texts for ex in examples] == [
    ('A man, with a hat, is playing a "blue" guitar.', "Someone makes music."),
    ("The cat sat.", "A dog\nran."),
    ("Paris is nice", "hello world"),
  ]
  # The second row spans lines 3-4: its source is where it starts.
  assert [ex.source for ex in examples] == [f"{path}:2", f"{path}:3", f"{path}:5"]
  assert [ex.label for ex in examples] == ["entailment", "contradiction", "neutral"]


def test_tsv_keeps_bare_quotes():
  path = str(GENERIC / "pairs.tsv")
  examples = readers.read_split(make_task(dev=path, text_fields=("premise", "hypothesis")), "dev")
  assert examples[0].texts == ('He said "hi.', 'A "quote')
  assert [ex.source for ex in examples] == [f"{path}:2", f"{path}:3"]


def test_gzip_jsonl_integer_labels_and_max_examples():
  path = str(GENERIC / "single.jsonl.gz")
  task = make_task(train=path, text_fields=("text",), label_field="y")
  examples = readers.read_split(task, "train")
  assert [(ex.texts, ex.label) for ex in examples] == [
    (("hello world",), "1"),
    (("the cat sat",), "0"),
    (("unaffable",), "1"),
  ]
  assert readers.label_list(task, examples) == ["0", "1"]
  task.max_examples = 2
  assert readers.read_split(task, "train") == examples[:2]


def test_json_booleans_are_the_classes_1_and_0(tmp_path):
  """46, fault 8: true/false and 1/0 in one column were 4 classes; true == 1, false == 0."""
  path = tmp_path / "mixed.jsonl"
  labels = [True, 1, False, 0, 1.0, "1", False]
  path.write_text(
    "".join(json.dumps({"sentence": f"s{i}", "label": v}) + "\n" for i, v in enumerate(labels))
  )
  task = make_task(train=str(path))
  examples = readers.read_split(task, "train")
  assert [ex.label for ex in examples] == ["1", "1", "0", "0", "1", "1", "0"]
  assert readers.label_list(task, examples) == ["0", "1"]
  # Multiple choice: a boolean is no ending's index.
  path.write_text(json.dumps({"context": "c", "endings": ["a", "b"], "label": True}) + "\n")
  choice = make_task(kind="multiple_choice", train=str(path), text_fields=("context", "endings"))
  with pytest.raises(ValueError, match=r"mixed.jsonl:1: train label 'True' is not the index"):
    readers.check_labels(readers.read_split(choice, "train"), [], "train")


def test_regression_labels_are_floats():
  path = str(GENERIC / "scores.jsonl")
  task = make_task(kind="regression", train=path, text_fields=("s1", "s2"), label_field="score")
  examples = readers.read_split(task, "train")
  assert [ex.label for ex in examples] == [5.0, 3.8, 0.0]
  assert all(isinstance(ex.label, float) for ex in examples)
  assert readers.label_list(task, examples) == []


def test_unlabelled_test_split_and_absent_split():
  path = str(GENERIC / "pairs.jsonl")
  task = make_task(test=path, text_fields=("premise",), label_field="gold")
  assert [ex.label for ex in readers.read_split(task, "test")] == [None] * 3
  assert not readers.has_split(task, "dev")
  with pytest.raises(ValueError, match="has no dev split"):
    readers.read_split(task, "dev")
  # train and dev must carry labels.
  with pytest.raises(ValueError, match=re.escape(f"{path}:1: missing field 'gold'")):
    readers.read_split(make_task(train=path, text_fields=("premise",), label_field="gold"), "train")


def test_multiple_choice_endings_list():
  path = str(GENERIC / "choices.jsonl")
  task = make_task(
    kind="multiple_choice", train=path, text_fields=("ctx", "endings"), label_field="label"
  )
  examples = readers.read_split(task, "train")
  assert examples[1] == TextExample(
    ("paris is", "nice", "a b c d e f", "the cat sat"), "2", f"{path}:2"
  )
  assert readers.label_list(task, examples) == []
  readers.check_labels(examples, [], "train")
  bad = [TextExample(("c", "e1", "e2"), "2", "x.jsonl:9")]
  with pytest.raises(ValueError, match=re.escape("x.jsonl:9: train label '2' is not the index")):
    readers.check_labels(bad, [], "train")


# --- Tagging -------------------------------------------------------------------------------


def test_conll_columns_docstart_and_sentences():
  path = str(GENERIC / "ner.conll")
  task = make_task(kind="tagging", train=path)
  examples = readers.read_split(task, "train")
  assert examples == [
    TaggedExample(
      ("John", "lives", "in", "New", "York"),
      ("B-PER", "O", "O", "B-LOC", "I-LOC"),
      f"{path}:3",
    ),
    TaggedExample(("Johanson", "."), ("B-PER", "O"), f"{path}:11"),
  ]
  assert readers.label_list(task, examples) == ["B-LOC", "B-PER", "I-LOC", "O"]
  task.tag_column = 1  # the POS column
  assert readers.read_split(task, "train")[0].tags == ("NNP", "VBZ", "IN", "NNP", "NNP")
  task.max_examples = 1
  assert len(readers.read_split(task, "train")) == 1


def test_conll_words_only_test_split_is_unlabelled():
  path = str(GENERIC / "ner_words.conll")
  examples = readers.read_split(make_task(kind="tagging", test=path), "test")
  assert examples == [
    TaggedExample(("John", "lives"), None, f"{path}:1"),
    TaggedExample(("Paris",), None, f"{path}:4"),
  ]


def test_tagging_jsonl():
  path = str(GENERIC / "ner.jsonl")
  examples = readers.read_split(make_task(kind="tagging", train=path), "train")
  assert examples[1] == TaggedExample(
    ("Johanson", "\u200b", "unaffable"), ("B-PER", "O", "O"), f"{path}:2"
  )


def test_label_list_extra_splits_and_check_labels():
  train = [TaggedExample(("a",), ("O",), "t:1")]
  dev = [TaggedExample(("b", "c"), ("O", "B-X"), "d:1")]
  task = make_task(kind="tagging")
  assert readers.label_list(task, train) == ["O"]
  with pytest.raises(ValueError, match=re.escape("d:1: dev tag 'B-X' (word 2, 'c') is not one")):
    readers.check_labels(dev, ["O"], "dev")
  labels = readers.label_list(task, train, extra=(dev,))
  assert labels == ["B-X", "O"]
  readers.check_labels(dev, labels, "dev")


# --- GLUE presets --------------------------------------------------------------------------

# name -> (train count, first train texts, first train label, dev count, first test texts)
GLUE_EXPECTED = {
  "cola": (
    3,
    ("Our friends won't buy this analysis, let alone the next one we propose.",),
    "1",
    2,
    ("Bill whistled past the house.",),
  ),
  "sst2": (
    3,
    ("hide new secretions from the parental units ",),
    "0",
    2,
    ("uneasy mishmash of styles and genres .",),
  ),
  "mrpc": (
    2,
    (
      'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting '
      "his evidence .",
      'Referring to him as only " the witness " , Amrozi accused his brother of deliberately '
      "distorting his evidence .",
    ),
    "1",
    1,
    (
      "PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial "
      "officer , will report directly to Mr So .",
      "Current Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena "
      "will report to So .",
    ),
  ),
  "stsb": (
    2,
    ("A plane is taking off.", "An air plane is taking off."),
    5.0,
    1,
    ("A girl is styling her hair.", "A girl is brushing her hair."),
  ),
  "qqp": (
    2,
    (
      "How is the life of a math student? Could you describe your own experiences?",
      "Which level of prepration is enough for the exam jlpt5?",
    ),
    "0",
    1,
    ("Why am I getting an error?", "How do I fix this error?"),
  ),
  "mnli": (
    4,
    (
      "Conceptually cream skimming has two basic dimensions - product and geography.",
      "Product and geography are what make cream skimming work. ",
    ),
    "neutral",
    1,
    (
      "Hierbas, ans seco, ans dulce, and frigola are just a few names worth keeping a look-out "
      "for.",
      "Hierbas is a name worth looking out for.",
    ),
  ),
  "mnli_mismatched": (
    4,
    (
      "Conceptually cream skimming has two basic dimensions - product and geography.",
      "Product and geography are what make cream skimming work. ",
    ),
    "neutral",
    2,
    ("What have you decided, what are you going to do?", "So what's your decision?"),
  ),
  "qnli": (
    2,
    (
      "When did the third Digimon series begin?",
      "Unlike the two seasons before it and most of the seasons that followed, Digimon Tamers "
      "takes a darker and more realistic approach to its story.",
    ),
    "not_entailment",
    1,
    (
      "What organization is devoted to Jihad?",
      "For some decades prior to the First Palestine Intifada in 1987, the Muslim Brotherhood in "
      "Palestine took a quiescent stance.",
    ),
  ),
  "rte": (
    2,
    (
      "No Weapons of Mass Destruction Found in Iraq Yet.",
      "Weapons of Mass Destruction Found in Iraq.",
    ),
    "not_entailment",
    1,
    (
      "Mangla was summoned after Madhumita's sister Nidhi Shukla filed a complaint.",
      "Shukla is related to Mangla.",
    ),
  ),
  "wnli": (
    4,
    (
      "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
      "The carrot had a hole.",
    ),
    "1",
    1,
    (
      "Maude and Dora had seen the trains rushing across the prairie.",
      "Horses ran away when Maude and Dora came in sight.",
    ),
  ),
}


@pytest.mark.parametrize("name", sorted(GLUE_EXPECTED))
def test_glue_preset_reads_the_glue_layout(name):
  n_train, texts, label, n_dev, test_texts = GLUE_EXPECTED[name]
  preset = readers.GLUE[name]
  task = make_task(name=name, format="glue", kind=preset["kind"], glue_dir=str(GLUE_DIR))
  train = readers.read_split(task, "train")
  dev = readers.read_split(task, "dev")
  test = readers.read_split(task, "test")
  assert (len(train), train[0].texts, train[0].label, len(dev)) == (n_train, texts, label, n_dev)
  assert test[0].texts == test_texts and {ex.label for ex in test} == {None}
  labels = readers.label_list(task, train)
  assert labels == list(preset["labels"])
  readers.check_labels(train + dev, labels, "train")
  assert train[0].source.startswith(str(GLUE_DIR / preset["dir"] / "train.tsv") + ":")


def test_glue_presets_labels_metrics_and_files():
  got = {
    name: (p["kind"], p["labels"], p["metrics"], p["main_metric"], p["files"]["dev"])
    for name, p in readers.GLUE.items()
  }
  binary = ("0", "1")
  nli = ("entailment", "not_entailment")
  assert got == {
    "cola": ("classification", binary, ("mcc",), "mcc", "dev.tsv"),
    "sst2": ("classification", binary, ("accuracy",), "accuracy", "dev.tsv"),
    "mrpc": ("classification", binary, ("f1", "accuracy"), "f1", "dev.tsv"),
    "stsb": ("regression", (), ("pearson", "spearman"), "spearman", "dev.tsv"),
    "qqp": ("classification", binary, ("f1", "accuracy"), "f1", "dev.tsv"),
    "mnli": (
      "classification",
      ("contradiction", "entailment", "neutral"),
      ("accuracy",),
      "accuracy",
      "dev_matched.tsv",
    ),
    "mnli_mismatched": (
      "classification",
      ("contradiction", "entailment", "neutral"),
      ("accuracy",),
      "accuracy",
      "dev_mismatched.tsv",
    ),
    "qnli": ("classification", nli, ("accuracy",), "accuracy", "dev.tsv"),
    "rte": ("classification", nli, ("accuracy",), "accuracy", "dev.tsv"),
    "wnli": ("classification", binary, ("accuracy",), "accuracy", "dev.tsv"),
  }


def test_glue_unknown_task_and_missing_dir(tmp_path):
  with pytest.raises(ValueError, match="task.name='sst5' is not a GLUE task"):
    readers.read_split(make_task(name="sst5", format="glue"), "train")
  task = make_task(name="rte", format="glue", glue_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path}/RTE/train.tsv: no such file")):
    readers.read_split(task, "train")


# --- TFDS ----------------------------------------------------------------------------------


def _prepare_tfds_glue(data_dir, config, label_names, rows_by_split):
  """A tiny TFDS glue/<config> in array_record format, written offline like `tfds build`."""
  tfds = pytest.importorskip("tensorflow_datasets")
  text_names = [k for k in rows_by_split["train"][0] if k != "label"]

  class Glue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("2.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config)]

    def _info(self):
      features = {name: tfds.features.Text() for name in text_names}
      features["label"] = tfds.features.ClassLabel(names=label_names)
      features["idx"] = np.int32
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(rows) for split, rows in rows_by_split.items()}

    def _generate_examples(self, rows):
      for i, row in enumerate(rows):
        yield i, {**row, "idx": i}

  Glue(config=config, data_dir=str(data_dir), file_format="array_record").download_and_prepare()


def test_tfds_glue_local_array_record(tmp_path):
  _prepare_tfds_glue(
    tmp_path,
    "mnli",
    ["entailment", "neutral", "contradiction"],  # TFDS's order, not GLUE's
    {
      "train": [
        {"premise": "p0", "hypothesis": "h0", "label": 2},
        {"premise": "p1 caf\u00e9", "hypothesis": "h1", "label": 0},
      ],
      "validation_matched": [{"premise": "p2", "hypothesis": "h2", "label": 1}],
      "test_matched": [{"premise": "p3", "hypothesis": "h3", "label": -1}],
    },
  )
  task = make_task(name="mnli", format="tfds", tfds_data_dir=str(tmp_path))
  train = readers.read_split(task, "train")
  assert [(ex.texts, ex.label) for ex in train] == [
    (("p0", "h0"), "contradiction"),
    (("p1 caf\u00e9", "h1"), "entailment"),
  ]
  assert train[1].source == f"{tmp_path}/glue/mnli/2.0.0[train]:1"
  assert [(ex.texts, ex.label) for ex in readers.read_split(task, "dev")] == [
    (("p2", "h2"), "neutral")
  ]
  assert [ex.label for ex in readers.read_split(task, "test")] == [None]
  assert readers.label_list(task, train) == ["contradiction", "entailment", "neutral"]
  # TFDS's names ("positive") map to GLUE's label strings by index.
  _prepare_tfds_glue(
    tmp_path, "sst2", ["negative", "positive"], {"train": [{"sentence": "good", "label": 1}]}
  )
  sst2 = readers.read_split(
    make_task(name="sst2", format="tfds", tfds_data_dir=str(tmp_path)), "train"
  )
  assert sst2 == [TextExample(("good",), "1", f"{tmp_path}/glue/sst2/2.0.0[train]:0")]


def test_tfds_tfrecord_dataset_is_a_one_line_error(tmp_path):
  _prepare_tfds_glue(
    tmp_path, "rte", ["entailment", "not_entailment"], {"train": [{"sentence1": "a", "label": 0}]}
  )
  # What `tfds build` writes by default: tfrecord, which needs TensorFlow to read.
  info_path = tmp_path / "glue" / "rte" / "2.0.0" / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info_path.write_text(json.dumps({**info, "fileFormat": "tfrecord"}))
  task = make_task(name="rte", format="tfds", tfds_data_dir=str(tmp_path))
  with pytest.raises(ValueError) as e:
    readers.read_split(task, "train")
  message = str(e.value)
  assert message.startswith(f"{info_path.parent}: cannot be read without TensorFlow (")
  assert "--file_format=array_record" in message and "\n" not in message


def test_tfds_missing_dataset_never_downloads(tmp_path):
  task = make_task(name="rte", format="tfds", tfds_data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError) as e:
    readers.read_split(task, "train")
  message = str(e.value)
  assert message.startswith(f"{tmp_path}/glue/rte: no prepared TFDS dataset glue/rte")
  assert "tfds build glue/rte" in message and "\n" not in message
  assert not (tmp_path / "downloads").exists()


# --- Real task data (../shared/data/tasks) -------------------------------------------------

SHARED_TASKS = {
  "rotten_tomatoes": dict(kind="classification", text_fields=("sentence",)),
  "vitaminc": dict(kind="classification", text_fields=("premise", "hypothesis")),
  "brown_pos": dict(kind="tagging", tags_field="tags_base"),
  "wnut16_ner": dict(kind="tagging"),
}


def check_shared_task(tasks_dir: pathlib.Path, name: str, tok) -> None:
  root = tasks_dir / name
  task = make_task(
    name=name, **{s: str(root / f"{s}.jsonl.gz") for s in readers.SPLITS}, **SHARED_TASKS[name]
  )
  meta = json.loads((root / "meta.json").read_text())
  splits = {s: readers.read_split(task, s) for s in readers.SPLITS}
  # brown_pos: dev and test hold a few rare tags that train lacks.
  extra = (splits["dev"], splits["test"]) if name == "brown_pos" else ()
  labels = readers.label_list(task, splits["train"], extra=extra)
  for split, examples in splits.items():
    assert len(examples) == meta["counts"][split], (name, split)
    readers.check_labels(examples, labels, split)
    enc = encode_lib.encode(examples, task.kind, tok, 128, labels)
    assert enc.n_examples == len(enc.rows) == len(examples)
    assert max(len(r["input_ids"]) for r in enc.rows) <= 128
    if task.kind == "classification":
      counts = np.bincount([int(r["label"]) for r in enc.rows], minlength=len(labels))
      assert dict(zip(labels, counts.tolist(), strict=True)) == meta["counts"][f"{split}_labels"]
    else:
      kept = sum(int(r["n_words"]) for r in enc.rows)
      scored = sum(int((r["label_ids"] >= 0).sum()) for r in enc.rows)
      assert scored == kept <= sum(len(ex.words) for ex in examples)


@pytest.mark.shared_data
@pytest.mark.parametrize("name", sorted(SHARED_TASKS))
def test_shared_tasks_read_and_encode(shared_data, name, tok):
  check_shared_task(shared_data / "tasks", name, tok)
