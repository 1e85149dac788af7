"""Other formats' checkpoints: every checkpoint one loader reads, HuggingFace and TF io.

loader    detects a checkpoint's format and reads it (orbax workdir or step, params dir, HF,
          TF); `python -m bert_jax.convert` is its CLI
hf_io     HuggingFace / TF checkpoints and our params dirs, read and written
hf_names  our parameter names <-> HuggingFace's and TF's
hf_heads  fine-tuned models: their task.json and HuggingFace's head classes
"""
