"""Optional hand-written CPU kernels (see cpu_gemm.py)."""

from bert_jax.kernels.cpu_gemm import available, bf16_matmul, unavailable_reason

__all__ = ["available", "bf16_matmul", "unavailable_reason"]
