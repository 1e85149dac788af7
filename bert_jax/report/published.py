"""The published numbers our tables are set beside, as data: which paper column each of our
tasks stands for, and the rows of each table `--paper` can add."""

from __future__ import annotations

# Our stand-in tasks (the downstream suite's) and GLUE/SQuAD presets -> the paper's column each
# stands for.
COLUMNS = {
  "rotten_tomatoes": "SST-2",
  "sst2": "SST-2",
  "vitaminc": "MNLI-m",
  "mnli": "MNLI-m",
  "squadshifts": "SQuAD",
  "squad_split": "SQuAD",
  "squad_qnli": "QNLI",
  "squad": "SQuAD",
  "qnli": "QNLI",
  "mrpc": "MRPC",
}
ORDER = ("MNLI-m", "QNLI", "MRPC", "SST-2", "SQuAD")
LM_PPL = "LM ppl"
SIZE_FIELDS = ("model.num_layers", "model.hidden_size", "model.num_heads")
# Devlin et al. (2019), dev sets: (row label, config fields it sets, {column: value}).
# Table 5 (BERT-Base architecture): accuracies, SQuAD v1.1 F1.
# Table 6: held-out masked-LM perplexity and accuracies of 5 fine-tuning restarts (mean).
TABLES: dict[str, list[tuple[str, dict[str, int], dict[str, float]]]] = {
  "table5": [
    ("BERT-Base", {}, {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD": 88.5}),
    ("No NSP", {}, {"MNLI-m": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD": 87.9}),
    (
      "LTR & No NSP",
      {},
      {"MNLI-m": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD": 77.8},
    ),
    ("+ BiLSTM", {}, {"MNLI-m": 82.1, "QNLI": 84.1, "MRPC": 75.7, "SST-2": 91.6, "SQuAD": 84.9}),
  ],
  "table6": [
    (
      f"L={layers} H={hidden} A={heads}",
      dict(zip(SIZE_FIELDS, (layers, hidden, heads), strict=True)),
      v,
    )
    for layers, hidden, heads, v in (
      (3, 768, 12, {LM_PPL: 5.84, "MNLI-m": 77.9, "MRPC": 79.8, "SST-2": 88.4}),
      (6, 768, 3, {LM_PPL: 5.24, "MNLI-m": 80.6, "MRPC": 82.2, "SST-2": 90.7}),
      (6, 768, 12, {LM_PPL: 4.68, "MNLI-m": 81.9, "MRPC": 84.8, "SST-2": 91.3}),
      (12, 768, 12, {LM_PPL: 3.99, "MNLI-m": 84.4, "MRPC": 86.7, "SST-2": 92.9}),
      (12, 1024, 16, {LM_PPL: 3.54, "MNLI-m": 85.7, "MRPC": 86.9, "SST-2": 93.3}),
      (24, 1024, 16, {LM_PPL: 3.23, "MNLI-m": 86.6, "MRPC": 87.8, "SST-2": 93.7}),
    )
  ],
  # Not Devlin et al.: RoBERTa (Liu et al. 2019) Table 1, BERT-Base size, dev: SQuAD 2.0 F1,
  # MNLI-m, SST-2 accuracy.
  "masking": [
    ("static (RoBERTa Table 1; SQuAD 2.0)", {}, {"SQuAD": 78.3, "MNLI-m": 84.3, "SST-2": 92.5}),
    ("dynamic (RoBERTa Table 1; SQuAD 2.0)", {}, {"SQuAD": 78.7, "MNLI-m": 84.0, "SST-2": 92.9}),
  ],
  # The BERT repository's README (2019-05-31 whole-word release), BERT-Large uncased, dev:
  # SQuAD 1.1 F1, MultiNLI accuracy.
  "wwm": [
    ("BERT-Large (BERT README)", {}, {"SQuAD": 91.0, "MNLI-m": 86.05}),
    ("+ whole-word masking (BERT README)", {}, {"SQuAD": 92.8, "MNLI-m": 87.07}),
  ],
}


# What each --paper table is, for the table's title.
SOURCES = {
  "table5": "Devlin et al. 2019 Table 5, dev sets",
  "table6": "Devlin et al. 2019 Table 6, dev sets",
  "masking": "Liu et al. 2019 (RoBERTa) Table 1, dev sets",
  "wwm": "the BERT repository's whole-word masking table, BERT-Large, dev sets",
}
