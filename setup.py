"""bert_jax: BERT pretraining and ablations in JAX/Flax, TPU-first."""

import os

import setuptools

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
  LONG_DESCRIPTION = f.read()

PLOTS = ["matplotlib>=3.8"]
# The versions the code is tested with: jax 0.10.2 / flax 0.12.8 (CPU, the test suite;
# requirements-lock.txt pins that set). The GPU image (docs/gpu.md) has jax 0.11.2 / flax 0.12.10.
JAX = ">=0.10.2,<0.12"

setuptools.setup(
  name="bert_jax",
  version="0.1.0",
  description="Faithful, fast BERT pretraining and ablations in JAX/Flax (linen).",
  long_description=LONG_DESCRIPTION,
  long_description_content_type="text/markdown",
  license="Apache-2.0",
  license_files=["LICENSE", "NOTICE"],
  classifiers=[
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Science/Research",
    "License :: OSI Approved :: Apache Software License",
    "Operating System :: POSIX :: Linux",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.11",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
  ],
  python_requires=">=3.11",
  # configs/ stays at the top of the checkout (`--config=configs/local.py`) and installs as
  # bert_jax.configs, so `--config=local` finds it after a non-editable install (bert_jax/cli.py).
  packages=[*setuptools.find_packages(include=["bert_jax", "bert_jax.*"]), "bert_jax.configs"],
  package_dir={"bert_jax.configs": "configs"},
  package_data={"bert_jax": ["data/*.txt"]},
  install_requires=[
    f"jax{JAX}",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8,<0.13",
    "grain>=0.2.18,<0.3",
    "array_record>=0.8.6",
    "sentencepiece>=0.2",
    "tokenizers>=0.22",
    "ml-collections>=1.1",
    "absl-py>=2.1",
    "tensorboardX>=2.6",
    "safetensors>=0.4",
    "numpy>=2.0",
    "protobuf",
  ],
  extras_require={
    "test": ["pytest>=8", "pytest-xdist>=3.5", "ruff>=0.6", *PLOTS],  # report's plots are tested
    "tfds": ["tensorflow-datasets>=4.9.10"],  # create_data --tfds_name
    "plots": PLOTS,  # report's loss plots
    "tpu": [f"jax[tpu]{JAX}"],
    # NVIDIA GPUs: the CUDA 12 or CUDA 13 wheels of jaxlib's plugin (with CUDA's libraries);
    # `cuda` is the CUDA 12 one.
    "cuda": [f"jax[cuda12]{JAX}"],
    "cuda12": [f"jax[cuda12]{JAX}"],
    "cuda13": [f"jax[cuda13]{JAX}"],
    "tf": ["tensorflow-cpu"],
    "gcs": ["gcsfs", "google-cloud-storage"],  # gs:// workdirs
    # The CPU comparison's peers (transformers 4.x still has the Flax BERT); a GPU box's own
    # torch / transformers serve `benchmark --gpu` (docs/gpu.md).
    "peers": ["torch==2.13.0", "transformers==4.57.6"],
  },
  entry_points={
    "console_scripts": [
      "bert_jax_train=bert_jax.main:run",
      "bert_jax_finetune=bert_jax.finetune.__main__:run",
      "bert_jax_create_data=bert_jax.create_data:run",
      "bert_jax_train_tokenizer=bert_jax.train_tokenizer:run",
      "bert_jax_convert=bert_jax.convert:run",
      "bert_jax_benchmark=bert_jax.benchmark.__main__:run",
      "bert_jax_aot=bert_jax.aot:run",
      "bert_jax_report=bert_jax.report.__main__:run",
    ]
  },
)
