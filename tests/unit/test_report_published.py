"""bert_jax.report.published: the paper numbers the tables are set beside, checked against the
papers, and the mapping of our stand-in tasks onto the paper's columns."""

import re

from bert_jax.report import published


def test_every_task_stands_for_a_column_the_tables_order():
  assert set(published.COLUMNS.values()) == set(published.ORDER)
  assert published.COLUMNS["rotten_tomatoes"] == "SST-2"
  assert published.COLUMNS["vitaminc"] == "MNLI-m"
  assert published.COLUMNS["squad_qnli"] == "QNLI" and published.COLUMNS["squadshifts"] == "SQuAD"
  assert list(published.SOURCES) == list(published.TABLES) == ["table5", "table6", "masking", "wwm"]
  for name, rows in published.TABLES.items():
    for label, _, values in rows:
      assert set(values) <= {*published.ORDER, published.LM_PPL}, (name, label)
      assert all(0 < v < 100 for v in values.values()), (name, label)


def test_table5_rows_are_devlin_et_al_table5():
  rows = {label: values for label, _, values in published.TABLES["table5"]}
  assert list(rows) == ["BERT-Base", "No NSP", "LTR & No NSP", "+ BiLSTM"]
  assert rows["BERT-Base"] == {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7,
                               "SQuAD": 88.5}  # fmt: skip
  assert rows["LTR & No NSP"]["SQuAD"] == 77.8 and rows["+ BiLSTM"]["SQuAD"] == 84.9
  assert all(fields == {} for _, fields, _ in published.TABLES["table5"])


def test_table6_rows_set_the_size_fields_their_labels_name():
  rows = published.TABLES["table6"]
  assert len(rows) == 6
  sizes = []
  for label, fields, values in rows:
    layers, hidden, heads = map(int, re.fullmatch(r"L=(\d+) H=(\d+) A=(\d+)", label).groups())
    assert fields == {"model.num_layers": layers, "model.hidden_size": hidden,
                      "model.num_heads": heads}  # fmt: skip
    sizes.append(layers * hidden**2)
    assert set(values) == {published.LM_PPL, "MNLI-m", "MRPC", "SST-2"}
  assert sizes == sorted(sizes)  # smallest first, as the paper
  # Perplexity falls and accuracy rises with size in the paper's table.
  ppl = [v[published.LM_PPL] for _, _, v in rows]
  assert ppl == sorted(ppl, reverse=True) and (ppl[0], ppl[-1]) == (5.84, 3.23)
  sst = [v["SST-2"] for _, _, v in rows]
  assert sst == sorted(sst) and (sst[0], sst[-1]) == (88.4, 93.7)
