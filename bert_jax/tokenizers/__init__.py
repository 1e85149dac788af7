"""Tokenizers: BERT's WordPiece and SentencePiece behind one interface.

tokenizer  the Tokenizer (basic tokenization, WordPiece, SentencePiece), the bundled vocab
files      reading and writing a tokenizer's files (vocab.txt, HF tokenizer_config.json)
training   training a vocab (`python -m bert_jax.train_tokenizer` is its CLI)
"""
