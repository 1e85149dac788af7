"""Fine-tuning and downstream evaluation (`python -m bert_jax.finetune`: its docstring, in
__main__.py, is the user's guide); `finetune(config, workdir)` is the library call.

  grid.py     a run: one recipe (a point) of every seed, or config.grid's points, best dev kept
  inputs.py   what a point reads first: mesh, model config, init checkpoint, tokenizer, task data
  data.py     the task's splits, each a named `Split`, read through the task kinds' registry
  seed.py     one seed (`SeedRun`: what every seed of a point shares): its train and eval
              steps, training, best-dev selection, best/
  workdir.py  one run per workdir: config.json and inputs.json checked on a rerun;
              results.json (every seed, mean/std/..., the baseline); run_status.json
  __main__.py the command line
"""

from bert_jax.finetune.grid import finetune

__all__ = ["finetune"]
