"""The scripts that build real-data tasks from the shared sets (tools/tasks/make_mc_task.py,
make_squad_subset.py, make_regression_task.py, make_brown_genre.py, make_squad_tasks.py), on
tiny hand-written inputs."""

import gzip
import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def _load(name):
  sys.path.insert(0, os.path.join(REPO, "tools", "tasks"))
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)


mc = _load("make_mc_task")
subset = _load("make_squad_subset")
regression = _load("make_regression_task")
genre = _load("make_brown_genre")
squad_tasks = _load("make_squad_tasks")

CONTEXT = (
  "The tower was built in 1889 by Gustave Eiffel. It is 330 metres tall today. "
  '"Nobody liked it at first," wrote one critic. Paris now sells many small copies of it!'
)


def _qa(qid, question, text, start):
  return {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}


def _article():
  other = "Visitors climb the stairs every single day. The lifts were added much later on."
  qas = [
    _qa("q1", "Who built it?", "Gustave Eiffel", CONTEXT.index("Gustave")),
    _qa("q2", "How tall is it?", "330 metres", CONTEXT.index("330")),
    _qa("q3", "Bad offset?", "1889", 3),
  ]
  return {
    "title": "t",
    "paragraphs": [{"context": CONTEXT, "qas": qas}, {"context": other, "qas": []}],
  }


def test_sentences_split_at_end_punctuation_before_capitals_digits_and_quotes():
  got = [t for _, t in mc.sentences(CONTEXT)]
  assert got == [
    "The tower was built in 1889 by Gustave Eiffel.",
    "It is 330 metres tall today.",
    '"Nobody liked it at first," wrote one critic.',
    "Paris now sells many small copies of it!",
  ]
  assert all(CONTEXT[s:].startswith(t) for s, t in mc.sentences(CONTEXT))


def test_mc_rows_hold_the_answer_sentence_and_three_others_of_the_article():
  stats = dict(questions=0, bad_offset=0, too_few_sentences=0)
  rows = mc.article_examples(_article(), stats)
  assert stats == dict(questions=3, bad_offset=1, too_few_sentences=0)
  by_id = {r["id"]: r for r in rows}
  assert by_id["q1"]["choices"][by_id["q1"]["label"]] == mc.sentences(CONTEXT)[0][1]
  assert by_id["q2"]["choices"][by_id["q2"]["label"]] == "It is 330 metres tall today."
  for r in rows:
    assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4
    answer = "Gustave Eiffel" if r["id"] == "q1" else "330 metres"
    assert [answer in c for c in r["choices"]].count(True) == 1
  # Seeded by the question id: the same rows on every run.
  assert rows == mc.article_examples(_article(), dict(stats))


def test_mc_question_without_enough_other_sentences_is_left_out():
  three = CONTEXT[: CONTEXT.index("Paris")].strip()  # the answer's and 2 others
  article = {"paragraphs": [{"context": three, "qas": [_qa("q", "?", "tower", 4)]}]}
  stats = dict(questions=0, bad_offset=0, too_few_sentences=0)
  assert mc.article_examples(article, stats) == []
  assert stats["too_few_sentences"] == 1


def test_squad_subset_keeps_the_first_n_questions_in_order():
  data = {"version": "1.1", "data": [_article(), _article()]}
  cut = subset.first_questions(data, 4)
  ids = [q["id"] for a in cut["data"] for p in a["paragraphs"] for q in p["qas"]]
  assert ids == ["q1", "q2", "q3", "q1"] and cut["version"] == "1.1"
  assert len(cut["data"][1]["paragraphs"]) == 1
  assert len(data["data"][1]["paragraphs"][0]["qas"]) == 3  # the input is not changed


def test_noun_density_counts_brown_lower_case_noun_tags(tmp_path):
  src, dst = tmp_path / "train.jsonl.gz", tmp_path / "out.jsonl.gz"
  rows = [
    {
      "tokens": ["The", "dogs", "of", "Texas", "bark"],
      "tags_base": ["at", "nns", "in", "np", "vb"],
    },
    {"tokens": ["Hi", "."], "tags_base": ["uh", "."]},  # under 4 words: left out
  ]
  with gzip.open(src, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  assert regression.convert(str(src), str(dst), 0) == 1
  with gzip.open(dst, "rt") as f:
    assert [json.loads(line) for line in f] == [
      {"sentence": "The dogs of Texas bark", "label": 0.4}
    ]


def test_brown_genre_labels_prose_kind_drops_short_lines_and_shuffles_by_seed():
  rows = [
    {"tokens": ["It", "was", "a", "dark", "night", "."], "genre": "mystery"},
    {"tokens": ["The", "senate", "voted", "on", "Tuesday", "."], "genre": "news"},
    {"tokens": ["Austin", ",", "Texas"], "genre": "news"},  # a headline: under 5 words
    *(
      {"tokens": ["Sentence", "number", str(i), "of", "the", "lore"], "genre": "lore"}
      for i in range(20)
    ),
  ]
  lines = [json.dumps(r) for r in rows]
  got = genre.rows(lines, min_words=5, seed=0)
  assert len(got) == 22 and got == genre.rows(lines, min_words=5, seed=0)
  assert got != genre.rows(lines, min_words=5, seed=1)  # shuffled, by the seed
  by_sentence = {r["sentence"]: r for r in got}
  assert by_sentence["It was a dark night ."]["label"] == "imaginative"
  assert by_sentence["The senate voted on Tuesday ."] == {
    "sentence": "The senate voted on Tuesday .",
    "label": "informative",
    "genre": "news",
  }
  assert "Austin , Texas" not in by_sentence


def test_brown_genre_names_the_file_and_line_of_a_bad_row():
  with pytest.raises(ValueError, match=r"^train.jsonl.gz:2: not a brown_pos row \(KeyError"):
    genre.rows(['{"tokens": ["a"], "genre": "news"}', '{"tokens": ["b"]}'], 1, 0, "train.jsonl.gz")
  with pytest.raises(ValueError, match=r"^x:1: not a brown_pos row \(JSONDecodeError"):
    genre.rows(["{not json"], 1, 0, "x")


def test_brown_genre_names_a_file_that_is_not_gzip_or_utf8_and_writes_nothing(tmp_path):
  root, out = tmp_path / "tasks", tmp_path / "out"
  (root / "brown_pos").mkdir(parents=True)
  good = json.dumps({"tokens": ["a", "b", "c", "d", "e"], "genre": "news"}) + "\n"
  for split in ("train", "dev"):
    with gzip.open(root / "brown_pos" / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
      f.write(good)
  test = root / "brown_pos" / "test.jsonl.gz"
  for content, what in (
    (b"plain text", "Not a gzipped file"),
    (gzip.compress(b"\xff\xfe"), "utf-8"),
  ):
    test.write_bytes(content)
    r = subprocess.run(
      [sys.executable, os.path.join(REPO, "tools", "tasks", "make_brown_genre.py"),
       f"--data_root={root}", f"--output={out}"],
      capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: {test}: ") and what in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


# ----------------------------------------------------------------------------- make_squad_tasks


def test_squad_qnli_pairs_a_question_with_its_answer_sentence_and_one_other():
  stats = dict(questions=0, bad_offset=0, answer_across_sentences=0, no_other_sentence=0)
  paragraph = _article()["paragraphs"][0]
  rows, kept = squad_tasks.paragraph_rows(paragraph, stats)
  assert stats == dict(questions=3, bad_offset=1, answer_across_sentences=0, no_other_sentence=0)
  assert [q["id"] for q in kept] == ["q1", "q2"]
  by_id = {r["id"]: r for r in rows}
  assert by_id["q1-0"] == dict(
    id="q1-0", question="Who built it?", sentence="The tower was built in 1889 by Gustave Eiffel.",
    label="entailment",
  )  # fmt: skip
  assert by_id["q2-0"]["sentence"] == "It is 330 metres tall today."
  for qid, answer in (("q1", "Gustave Eiffel"), ("q2", "330 metres")):
    other = by_id[f"{qid}-1"]
    assert other["label"] == "not_entailment" and answer not in other["sentence"]
    assert other["sentence"] in [t for _, t in mc.sentences(CONTEXT)]
  # Seeded by the question id: the same rows every run.
  assert rows == squad_tasks.paragraph_rows(paragraph, dict(stats))[0]


def test_squad_qnli_leaves_out_answers_across_sentences_and_lone_sentences():
  stats = dict(questions=0, bad_offset=0, answer_across_sentences=0, no_other_sentence=0)
  across = _qa("a", "?", "Eiffel. It is", CONTEXT.index("Eiffel"))
  lone = {"context": "Only one sentence here, about Paris.", "qas": [_qa("b", "?", "Paris", 30)]}
  assert squad_tasks.paragraph_rows({"context": CONTEXT, "qas": [across]}, stats) == ([], [])
  assert squad_tasks.paragraph_rows(lone, stats) == ([], [])
  assert stats["answer_across_sentences"] == 1 and stats["no_other_sentence"] == 1


def _squadshifts(root, articles_per_domain=30):
  d = root / "squadshifts"
  d.mkdir(parents=True)
  for domain in squad_tasks.DOMAINS:
    articles = []
    for i in range(articles_per_domain):
      a = _article()
      a["title"] = f"{domain}-{i}"
      for q in a["paragraphs"][0]["qas"]:
        q["id"] = f"{domain}-{i}-{q['id']}"
      articles.append(a)
    with gzip.open(d / f"{domain}_v1.0.json.gz", "wt", encoding="utf-8") as f:
      json.dump({"version": "1.1", "data": articles}, f)


def test_squad_tasks_no_group_straddles_splits_and_the_files_are_deterministic(tmp_path):
  _squadshifts(tmp_path / "in")
  out = tmp_path / "out"
  for _ in range(2):
    assert squad_tasks.main([f"--data_root={tmp_path / 'in'}", f"--output={out}"]) == 0
    first = {p.name: p.read_bytes() for p in sorted((out / "squad_qnli").iterdir())}
  assert squad_tasks.main([f"--data_root={tmp_path / 'in'}", f"--output={out}"]) == 0
  assert first == {p.name: p.read_bytes() for p in sorted((out / "squad_qnli").iterdir())}
  read = lambda p: [json.loads(ln) for ln in gzip.open(p, "rt")]
  groups = {}
  for split in ("train", "dev", "test"):
    rows = read(out / "squad_qnli" / f"{split}.jsonl.gz")
    squad = json.load(gzip.open(out / "squad_split" / f"{split}.json.gz", "rt"))
    titles = {a["title"] for a in squad["data"]}
    # new_wiki and nyt group by article; reddit by context (its one article is a collection).
    for t in titles:
      assert groups.setdefault(t, split) == split
    qids = {q["id"] for a in squad["data"] for p in a["paragraphs"] for q in p["qas"]}
    assert {r["id"].rsplit("-", 1)[0] for r in rows} == qids
    assert [r["label"] for r in rows].count("entailment") == len(rows) // 2
  assert set(groups.values()) == {"train", "dev", "test"}
  meta = json.load(open(out / "squad_qnli" / "meta.json"))
  assert meta["left_out"]["bad_offset"] == 90 and sum(meta["rows"].values()) == 2 * 180


def test_squad_tasks_name_a_file_that_is_not_squad_json(tmp_path, capsys):
  _squadshifts(tmp_path / "in", 1)
  (tmp_path / "in" / "squadshifts" / "nyt_v1.0.json.gz").write_bytes(b"plain")
  out = tmp_path / "out"
  assert squad_tasks.main([f"--data_root={tmp_path / 'in'}", f"--output={out}"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("make_squad_tasks.py: error: ") and "nyt_v1.0.json.gz" in err
  assert len(err.strip().splitlines()) == 1 and not out.exists()
