"""The bundled configs, installed as `bert_jax.configs` (setup.py's package_dir): an editable
install finds a mapped subpackage only when it has this file."""
