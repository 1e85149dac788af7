"""Writes the golden WordPiece fixtures in tests/fixtures/tokenizer/ from the ORIGINAL tokenizer.

The reference is google-research/bert's `tokenization.py` (FullTokenizer). It is never copied
into this project: it is read from a separate checkout and run with a stand-in for the one
TensorFlow name it uses (`tf.gfile.GFile`, which is just `open` here). Only `six` is needed.

How the committed fixtures were made (google-research/bert at eedf571, Python 3.11.7 with
unicodedata 14.0.0, the bundled bert-base-uncased vocab, md5 64800d5d8528ce344256daf115d4965e):

  mkdir -p /tmp/bert_ref
  git --git-dir=<mirror of google-research/bert> show HEAD:tokenization.py \
    > /tmp/bert_ref/tokenization.py
  /work/venv-ref/bin/python scripts/make_tokenizer_fixtures.py --bert_dir=/tmp/bert_ref \
    --corpus=../shared/data/corpus/pretrain_corpus.txt.gz

Outputs (all ids are reference ids with the bundled vocab):
  edge_cases.json     hand-picked strings -> ids, uncased and cased (do_lower_case=False).
  codepoints.json     for each block of 4096 code points, sha256 over the ids of "a{c}b {c}." for
                      every Unicode scalar value c in it (uncased and cased): pins the control,
                      whitespace, punctuation, CJK and accent rules character by character.
  corpus_sample.json  ids of a few hundred corpus lines (by index among non-empty lines).
  corpus_digest.json  sha256 over the ids of every non-empty corpus line, plus the counts.
The digest formats are defined by `ids_line` and `codepoint_text` below; tests/test_tokenizer.py
recomputes them with bert_jax.tokenizer.
"""

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
import types

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizer")
VOCAB = os.path.join(
  os.path.dirname(__file__), "..", "bert_jax", "data", "bert-base-uncased-vocab.txt"
)

# Strings chosen to hit every rule where BERT's tokenizer and the `tokenizers` defaults could
# disagree: word length limits, literal special tokens, accents, CJK, control characters,
# Unicode whitespace, the punctuation definition, casing.
_WORD = "pneumonoultramicroscopicsilicovolcanoconiosis"  # 45 chars, splits into wordpieces


def _long(n: int) -> str:
  return (_WORD * 10)[:n]


EDGE_CASES = [
  "",
  "   ",
  "Hello, World!",
  "the man went to the [MASK] .",
  "[CLS] a b [SEP] c d [SEP]",
  "[PAD] [UNK] [unused0] [unused993] [mask] [Mask]",
  "##ing ## # ###",
  _long(99),
  _long(100),
  _long(101),
  _long(150),
  _long(199),
  _long(200),
  _long(201),
  _long(250),
  "x " + _long(200) + " y " + _long(201) + " z",
  "é" * 200,
  "é" * 201,
  "e\u0301" * 100,
  "e\u0301" * 101,
  "a" + "\u0301" * 250,
  "我" * 300,
  _long(190) + "!" + _long(190),
  _long(190) + "\u00e9" * 15,
  "Café naïve résumé Ångström façade coöperate",
  "CAFÉ NAÏVE RÉSUMÉ",
  "İstanbul ıi IİIı",
  "ΟΔΟΣ ΟΔΟΣ. Σ σς ΣΑΣ",
  "Straße STRASSE ß ẞ",
  "ﬁnance ﬂow ǅemal Ǆ ǈ",
  "Æsir Œuvre Øre Ðð Þþ Łódź",
  "ḱṷṓn ṩ ǖ",
  "我爱北京天安门",
  "abc中文def 中a文",
  "日本語のテキスト カタカナ ひらがな",
  "한국어 텍스트",
  "𠀀𪜀𫝀𫠠𬺰 豈 丽",
  "\u3400\u4dbf\u4e00\u9fff\uf900\ufaff",
  "a\x00b c\x07d e\x1b[31mred\x1b[0m",
  "foo\u200bbar zero\u200cwidth join\u200der",
  "\ufeffbom at start",
  "replace\ufffdment char",
  "soft\u00adhyphen",
  "lrm\u200emark rlm\u200fmark",
  "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u0085g\x0bh\x0ci\tj\rk\nl",
  "a\u1680b\u180ec\u202fd\u205fe\u2000f\u200ag",
  "a\x1cb\x1dc\x1ed\x1ff",
  "a\x7fb\x80c\x9fd",
  "$5 ^caret `tick` ~tilde |pipe| {brace} <tag> a+b=c @at #hash %pct &amp *star _under_",
  "«guillemets» ¿qué? ¡sí! „quote“ ‚single‘",
  "em—dash en–dash ellipsis… bullet•point §4 ¶5 ·dot",
  "©2020 ®mark ™ ±5 ×2 ÷3 €5 £3 ¥9 °C µm",
  "✓ ★ → ← ∀x∃y ∑ √2 ∞",
  "private\ue000use \U000f0000plane15",
  "unassigned\u0378here \U000e0080tag",
  "😀 👍🏽 👨‍👩‍👧 🇺🇸",
  "हिन्दी தமிழ் ภาษาไทย العربية עברית",
  "Ελληνικά Русский Українська",
  "3.14 1,000,000 10:30 2020-01-01 v1.2.3",
  "http://example.com/a_b?c=d&e=f#frag user@example.org",
  "def f(x): return x**2  # comment",
  "don't won't y'all 'quoted' \"double\"",
  "U.S.A. e.g. i.e. Ph.D.",
  "multiple     spaces\t\ttabs\n\nnewlines",
  "UPPER lower MiXeD CamelCase",
  "ﬀ ﬃ ㎏ ½ ² ①",
  "\u0301leading combining",
  "Zalgo t̷̛̖e̸͈͝x̵̣͐t̶̰̓",
]


def codepoint_text(cp: int) -> str:
  c = chr(cp)
  return f"a{c}b {c}."


CODEPOINT_BLOCK = 4096


def codepoint_blocks():
  """(first code point, list of Unicode scalar values) for each block of 4096 code points."""
  for start in range(0, 0x110000, CODEPOINT_BLOCK):
    cps = [cp for cp in range(start, start + CODEPOINT_BLOCK) if not 0xD800 <= cp <= 0xDFFF]
    yield start, cps


def ids_line(ids) -> bytes:
  return (" ".join(map(str, ids)) + "\n").encode()


def corpus_lines(path: str):
  """Non-empty lines (without the newline). Only '\\n' ends a line, as in the data files."""
  with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
    for line in f:
      if line.strip():
        yield line[:-1] if line.endswith("\n") else line


def sample_indices(lines):
  """Every 1999th non-empty line plus every 300th line that is not pure ASCII."""
  picked, n_non_ascii = [], 0
  for i, line in enumerate(lines):
    if i % 1999 == 0:
      picked.append(i)
    elif not line.isascii():
      if n_non_ascii % 300 == 0:
        picked.append(i)
      n_non_ascii += 1
  return picked


def load_reference(bert_dir: str):
  tf = types.ModuleType("tensorflow")
  tf.gfile = types.SimpleNamespace(GFile=open)
  sys.modules["tensorflow"] = tf
  sys.path.insert(0, bert_dir)
  import tokenization  # the reference, from --bert_dir

  return tokenization


def _dump(name: str, obj) -> None:
  path = os.path.join(FIXTURES, name)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    f.write("\n")
  os.replace(path + ".tmp", path)
  print("wrote", path, flush=True)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument(
    "--bert_dir", required=True, help="directory holding the reference tokenization.py"
  )
  p.add_argument(
    "--corpus", default=None, help="pretrain_corpus.txt.gz (skip corpus fixtures if unset)"
  )
  p.add_argument("--only", default="edge,codepoints,corpus")
  args = p.parse_args()
  ref = load_reference(args.bert_dir)
  toks = {
    "uncased": ref.FullTokenizer(VOCAB, do_lower_case=True),
    "cased": ref.FullTokenizer(VOCAB, do_lower_case=False),
  }
  enc = {k: (lambda s, t=t: t.convert_tokens_to_ids(t.tokenize(s))) for k, t in toks.items()}
  with open(VOCAB, "rb") as f:
    vocab_md5 = hashlib.md5(f.read()).hexdigest()
  os.makedirs(FIXTURES, exist_ok=True)
  only = set(args.only.split(","))

  if "edge" in only:
    cases = [{"text": s, **{k: e(s) for k, e in enc.items()}} for s in EDGE_CASES]
    _dump("edge_cases.json", {"vocab_md5": vocab_md5, "cases": cases})

  if "codepoints" in only:
    t0 = time.time()
    out = {"vocab_md5": vocab_md5, "text": "a{c}b {c}.", "block": CODEPOINT_BLOCK}
    for k, e in enc.items():
      out[k] = {}
      for start, cps in codepoint_blocks():
        h = hashlib.sha256()
        for cp in cps:
          h.update(ids_line(e(codepoint_text(cp))))
        out[k][f"{start:06X}"] = h.hexdigest()
    _dump("codepoints.json", out)
    print(f"codepoints: {time.time() - t0:.0f}s", flush=True)

  if "corpus" in only and args.corpus:
    t0 = time.time()
    lines = list(corpus_lines(args.corpus))
    picked = set(sample_indices(lines))
    h, n_ids, sample = hashlib.sha256(), 0, {}
    for i, line in enumerate(lines):
      ids = enc["uncased"](line)
      h.update(ids_line(ids))
      n_ids += len(ids)
      if i in picked:
        sample[str(i)] = ids
      if i % 50000 == 0:
        print(f"{i} lines {time.time() - t0:.0f}s", flush=True)
    _dump("corpus_sample.json", {"vocab_md5": vocab_md5, "lowercase": True, "ids": sample})
    _dump(
      "corpus_digest.json",
      {
        "vocab_md5": vocab_md5,
        "lowercase": True,
        "corpus": os.path.basename(args.corpus),
        "num_lines": len(lines),
        "num_ids": n_ids,
        "sha256": h.hexdigest(),
      },
    )
    print(f"corpus: {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
  main()
