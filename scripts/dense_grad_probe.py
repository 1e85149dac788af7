"""XLA:CPU speed of one BERT-Base dense layer's three dots (forward, dX, dW) in bf16 and fp32,
4096 tokens x 768 -> 3072. The README's dW figures; try XLA_FLAGS=... to compare compiler paths.

  python scripts/dense_grad_probe.py
"""

import json
import statistics

import jax
import jax.numpy as jnp

from bert_jax.benchmark import host

M, K, N = 4096, 768, 3072
kx, kg, kw = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(kx, (M, K)).astype(jnp.bfloat16)
g = jax.random.normal(kg, (M, N)).astype(jnp.bfloat16)
w = (jax.random.normal(kw, (K, N)) * 0.02).astype(jnp.bfloat16)
dn = lambda lc, rc: ((lc, rc), ((), ()))
f32 = jnp.float32
variants = {
  "fwd_bf16": lambda x, g, w: jnp.dot(x, w, preferred_element_type=f32),
  "dx_bf16": lambda x, g, w: jax.lax.dot_general(g, w, dn((1,), (1,)), preferred_element_type=f32),
  "dw_bf16_TN": lambda x, g, w: jax.lax.dot_general(
    x, g, dn((0,), (0,)), preferred_element_type=f32
  ),
  "dw_f32_TN": lambda x, g, w: jax.lax.dot_general(x.astype(f32), g.astype(f32), dn((0,), (0,))),
}
for name, fn in variants.items():
  f = jax.jit(fn)
  ts = host.time_calls(lambda f=f: jax.block_until_ready(f(x, g, w)), reps=7, warmup=3)
  print(
    json.dumps(
      {
        "v": name,
        "ms": round(statistics.median(ts) * 1e3, 1),
        "gflops": round(2 * M * K * N / statistics.median(ts) / 1e9),
      }
    ),
    flush=True,
  )
