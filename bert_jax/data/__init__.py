"""Pretraining data: text in, records out, batches back.

  corpus          text files -> documents of sentences
  sequences       documents -> BERT's training instances (NSP pairs or full sentences)
  pretraining     one build: tokenize, make instances, mask, write (`python -m
                  bert_jax.create_data` is its CLI)
  writer          the streaming, parallel, deterministic writer of the record shards
  records         the record format and its fingerprint
  input_pipeline  records -> batches for the trainer (grain), the data's metadata

The bundled default corpus and vocab (`*.txt`) live in this folder as well.
"""
