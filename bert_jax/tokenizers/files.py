"""Tokenizers in HuggingFace's files, both ways.

Written: tokenizer_config.json, special_tokens_map.json and a `tokenizers` tokenizer.json, with
vocab.txt for WordPiece (BertTokenizerFast; its BertNormalizer differs from BERT's rules only on
characters BERT keeps and it drops: private-use, unassigned, see
bert_jax/tokenizers/tokenizer.py) or
spm.model for a unigram SentencePiece model (PreTrainedTokenizerFast over an equal `tokenizers`
Unigram). A SentencePiece BPE model has no such equivalent: one-line error, and
`convert --tokenizer=false` exports the weights alone. Read: HuggingFace's / Google's vocab.txt
with tokenizer_config.json's do_lower_case, or an exported spm.model.
"""

from __future__ import annotations

import json
import pathlib

from bert_jax.model_config import BertConfig
from bert_jax.runtime.files import PathLike, read_json
from bert_jax.tokenizers import tokenizer as tokenizer_lib

HF_VOCAB = "vocab.txt"
HF_TOKENIZER = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_SPECIAL_TOKENS = "special_tokens_map.json"
HF_SPM = "spm.model"  # a SentencePiece model, bert_jax's own name for it
_HF_SPECIAL_NAMES = {
  "unk_token": "[UNK]",
  "sep_token": "[SEP]",
  "pad_token": "[PAD]",
  "cls_token": "[CLS]",
  "mask_token": "[MASK]",
}


def _hf_wordpiece(tok: tokenizer_lib.WordPieceTokenizer):
  """BertTokenizerFast's tokenizer.json for our WordPiece (same ids as ours on BERT text)."""
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers

  vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
  hf = tokenizers.Tokenizer(
    models.WordPiece(
      vocab={t: i for i, t in enumerate(vocab)},
      unk_token="[UNK]",
      continuing_subword_prefix="##",
      max_input_chars_per_word=tok.max_input_chars_per_word,
    )
  )
  hf.normalizer = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=tok.lowercase
  )
  hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  hf.decoder = decoders.WordPiece(prefix="##")
  return hf


def _hf_unigram(tok: tokenizer_lib.SentencePieceTokenizer):
  """A `tokenizers` Unigram equal to a SentencePiece unigram model: its pieces and scores,
  its precompiled normalizer, whitespace collapsed and stripped, "▁" word prefixes."""
  import tokenizers
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tok.model_proto())
  spec, norm = proto.trainer_spec, proto.normalizer_spec
  if spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    raise ValueError(
      "only a unigram SentencePiece model exports to HuggingFace (this one is "
      f"{sentencepiece_model_pb2.TrainerSpec.ModelType.Name(spec.model_type)}); "
      "convert the weights alone with --tokenizer=false"
    )
  pieces = [(p.piece, p.score) for p in proto.pieces]
  hf = tokenizers.Tokenizer(models.Unigram(pieces, tok.unk_id, spec.byte_fallback))
  steps = [normalizers.Precompiled(norm.precompiled_charsmap)] if norm.precompiled_charsmap else []
  if norm.remove_extra_whitespaces:
    steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
  hf.normalizer = normalizers.Sequence(steps)
  scheme = "always" if norm.add_dummy_prefix else "never"
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  return hf


def hf_tokenizer_files(tok: tokenizer_lib.Tokenizer, cfg: BertConfig) -> dict[str, bytes]:
  """The tokenizer in HuggingFace's files: a `tokenizers` tokenizer.json (what
  AutoTokenizer loads), tokenizer_config.json and special_tokens_map.json; plus vocab.txt for
  WordPiece (BertTokenizerFast) or spm.model for a unigram SentencePiece model
  (PreTrainedTokenizerFast)."""
  import tokenizers
  from tokenizers import processors

  if tok.vocab_size != cfg.vocab_size:
    raise ValueError(
      f"the tokenizer has {tok.vocab_size} tokens but the weights' vocab_size is {cfg.vocab_size}"
    )
  config = {"model_max_length": cfg.max_position_embeddings, **_HF_SPECIAL_NAMES}
  if isinstance(tok, tokenizer_lib.WordPieceTokenizer):
    hf = _hf_wordpiece(tok)
    vocab = "".join(tok.id_to_token(i) + "\n" for i in range(tok.vocab_size))
    files = {HF_VOCAB: vocab.encode("utf-8")}
    config = {
      "tokenizer_class": "BertTokenizer",
      "do_lower_case": tok.lowercase,
      "strip_accents": None,
      "tokenize_chinese_chars": True,
      "clean_up_tokenization_spaces": False,
      **config,
    }
  elif isinstance(tok, tokenizer_lib.SentencePieceTokenizer):
    hf = _hf_unigram(tok)
    files = {HF_SPM: tok.model_proto()}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
  else:
    raise ValueError(f"a {tok.kind} tokenizer has no HuggingFace equivalent")
  cls, sep = ("[CLS]", tok.cls_id), ("[SEP]", tok.sep_id)
  hf.post_processor = processors.TemplateProcessing(
    single="[CLS]:0 $A:0 [SEP]:0",
    pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
    special_tokens=[cls, sep],
  )
  hf.add_special_tokens(
    [tokenizers.AddedToken(t, special=True) for t in _HF_SPECIAL_NAMES.values()]
  )
  dump = lambda obj: (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
  return {
    **files,
    HF_TOKENIZER: hf.to_str(pretty=True).encode("utf-8"),
    HF_TOKENIZER_CONFIG: dump(config),
    HF_SPECIAL_TOKENS: dump(_HF_SPECIAL_NAMES),
  }


def load_hf_tokenizer(directory: PathLike) -> tokenizer_lib.Tokenizer | None:
  """WordPiece from an HF (or Google) dir's vocab.txt (or, without one, the WordPiece vocab in
  tokenizer.json), cased or not as tokenizer_config.json's do_lower_case says (without one: as
  the vocab's letters say); SentencePiece from an exported spm.model; None when there is none."""
  d = pathlib.Path(directory)
  fast = (read_json(d / HF_TOKENIZER).get("model") or {}) if (d / HF_TOKENIZER).is_file() else {}
  fast = fast if fast.get("type") == "WordPiece" else {}
  if not (d / HF_VOCAB).is_file() and not isinstance(fast.get("vocab"), dict):
    if (d / HF_SPM).is_file():  # what hf_tokenizer_files writes for SentencePiece
      return tokenizer_lib.SentencePieceTokenizer.from_file(d / HF_SPM)
    return None
  config = read_json(d / HF_TOKENIZER_CONFIG) if (d / HF_TOKENIZER_CONFIG).is_file() else {}
  if (d / HF_VOCAB).is_file():
    vocab = tokenizer_lib.read_vocab(d / HF_VOCAB)
  else:
    by_id = sorted(fast["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
      raise ValueError(f"{d / HF_TOKENIZER}: WordPiece ids are not 0..{len(by_id) - 1}")
    vocab = [t for t, _ in by_id]
  # Without a tokenizer_config.json (Google's releases) the vocab says it: an uncased vocab
  # has no upper-case letters outside its [SPECIAL] tokens.
  cased_vocab = any(t != t.lower() for t in vocab if not t.startswith("["))
  lowercase = bool(config.get("do_lower_case", not cased_vocab))
  strip = config.get("strip_accents")
  if strip is not None and bool(strip) != lowercase:
    raise ValueError(
      f"{d / HF_TOKENIZER_CONFIG}: strip_accents={strip} with do_lower_case={lowercase} is not "
      "a BERT tokenizer setting"
    )
  if not config.get("tokenize_chinese_chars", True):
    raise ValueError(f"{d / HF_TOKENIZER_CONFIG}: tokenize_chinese_chars=false is not supported")
  options = {"lowercase": lowercase}
  if "max_input_chars_per_word" in fast:  # the fast tokenizer's word-length limit
    options["max_input_chars_per_word"] = int(fast["max_input_chars_per_word"])
  source = str(d / (HF_VOCAB if (d / HF_VOCAB).is_file() else HF_TOKENIZER))
  return tokenizer_lib.WordPieceTokenizer(vocab, source=source, **options)
