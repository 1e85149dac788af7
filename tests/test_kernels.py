"""Correctness of the optional AVX512-BF16 CPU GEMM (bert_jax/kernels) against a numpy f32 reference."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.kernels import cpu_gemm

pytestmark = pytest.mark.skipif(
  not cpu_gemm.available(), reason=f"bf16 CPU GEMM unavailable: {cpu_gemm.unavailable_reason()}"
)

SIZES = (1, 7, 33, 100, 513)


def _bf16(rng, shape):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), jnp.bfloat16)


def _check(a, b, b_transposed, out, a_transposed=False):
  a32 = np.asarray(a, np.float32).astype(np.float64)
  if a_transposed:
    a32 = a32.T
  b32 = np.asarray(b, np.float32).astype(np.float64)
  ref = a32 @ (b32.T if b_transposed else b32)
  out = np.asarray(out)
  assert out.dtype == np.float32 and out.shape == ref.shape
  # bf16 products are exact in f32; the only error is f32 summation (order differs from numpy's).
  k = a32.shape[1]
  tol = 4 * np.finfo(np.float32).eps * (np.abs(a32) @ np.abs(b32.T if b_transposed else b32)) * max(1, np.sqrt(k))
  np.testing.assert_array_less(np.abs(out - ref), tol + 1e-30)


@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("b_transposed", [False, True])
def test_odd_shapes(a_transposed, b_transposed):
  rng = np.random.default_rng(0)
  f = jax.jit(lambda a, b: cpu_gemm.bf16_matmul(a, b, b_transposed, a_transposed=a_transposed))
  for m, n, k in itertools.product(SIZES, SIZES, SIZES):
    a = _bf16(rng, (k, m) if a_transposed else (m, k))
    b = _bf16(rng, (n, k) if b_transposed else (k, n))
    _check(a, b, b_transposed, f(a, b), a_transposed)


@pytest.mark.parametrize("a_transposed,b_transposed", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocked_shapes_and_threads(a_transposed, b_transposed, threads):
  # Crosses the K block (768) and N block (384) boundaries, with several threads sharing the work.
  rng = np.random.default_rng(1)
  for m, n, k in [(390, 1100, 1601), (700, 130, 1030), (64, 64, 64)]:
    a = _bf16(rng, (k, m) if a_transposed else (m, k))
    b = _bf16(rng, (n, k) if b_transposed else (k, n))
    out = cpu_gemm.bf16_matmul(a, b, b_transposed, a_transposed=a_transposed, num_threads=threads)
    _check(a, b, b_transposed, out, a_transposed)


def test_zero_k_and_matches_xla():
  a = jnp.zeros((5, 0), jnp.bfloat16)
  b = jnp.zeros((0, 3), jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(cpu_gemm.bf16_matmul(a, b, False)), np.zeros((5, 3), np.float32))
  rng = np.random.default_rng(2)
  a, b = _bf16(rng, (96, 200)), _bf16(rng, (200, 80))
  xla = jnp.dot(a, b, preferred_element_type=jnp.float32)
  np.testing.assert_allclose(np.asarray(cpu_gemm.bf16_matmul(a, b, False)), np.asarray(xla), rtol=1e-4, atol=1e-3)


def test_rejects_bad_input():
  a = jnp.zeros((4, 6), jnp.bfloat16)
  with pytest.raises(ValueError):
    cpu_gemm.bf16_matmul(a, jnp.zeros((5, 3), jnp.bfloat16), False)
  with pytest.raises(ValueError):
    cpu_gemm.bf16_matmul(a.astype(jnp.float32), jnp.zeros((6, 3), jnp.bfloat16), False)
