"""Test set-up: 8 fake CPU devices so (2,2,2) meshes run on one CPU host."""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402
from absl import flags  # noqa: E402

# grain's multiprocessing workers read absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data():
  """Path to ../shared/data, or skip (a user's fresh clone does not have it)."""
  if not SHARED_DATA.is_dir():
    pytest.skip("../shared/data is absent")
  return SHARED_DATA
