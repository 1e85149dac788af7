"""Test set-up: 8 fake CPU devices so (2,2,2) meshes run on one CPU host, and the tiers.

unit/  one test file per module, named after it (test_<folder>_<module>.py inside a folder):
       the default run (the README's test command, CI)
e2e/   real processes (trainers, resumes, SLURM, two-process preemption): marked `slow` here,
       CI runs them too: pytest -m slow
lab/   the benchmark, GPU programs and flash attention: marked `lab`, not in CI:
       pytest -m lab
"""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite compiles hundreds of small programs and runs each a few times: XLA:CPU's backend at
# -O0 compiles them faster (cold cache, test_model + test_masking: 88 -> 63 s) and the code
# still runs fast enough here. test_train's subprocesses get the same flag (and no other).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
  ).strip()
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# Many tests compile the same tiny programs (also in subprocesses, which inherit the env var):
# a persistent compilation cache for the session cuts the suite's time.
import tempfile  # noqa: E402

_CACHE = os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bert_jax_test_jax_cache")
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

import pytest  # noqa: E402
from absl import flags  # noqa: E402

# grain's multiprocessing workers read absl flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()

TESTS = pathlib.Path(__file__).resolve().parent
_TIER_MARKS = {"e2e": "slow", "lab": "lab"}


def pytest_collection_modifyitems(config, items):
  """A test's folder is its tier: e2e/ tests are `slow`, lab/ tests `lab`."""
  for item in items:
    tier = pathlib.Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
    if tier in _TIER_MARKS:
      item.add_marker(_TIER_MARKS[tier])


SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data():
  """Path to ../shared/data, or skip (a user's fresh clone does not have it)."""
  if not SHARED_DATA.is_dir():
    pytest.skip("../shared/data is absent")
  return SHARED_DATA


@pytest.fixture
def backend_compiles():
  """The names of the programs XLA compiles while the test runs ('jit(train_step)', ...); an
  executable JAX already holds compiles nothing and adds no name."""
  import jax

  names: list[str] = []

  def listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      names.append(kw.get("fun_name", ""))

  jax.monitoring.register_event_duration_secs_listener(listen)
  yield names
  jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
  """The bundled corpus built once per session at sequence length 64 (a few seconds)."""
  from bert_jax.data import pretraining as pretraining_data

  out = tmp_path_factory.mktemp("data") / "local64"
  pretraining_data.build(
    str(
      pathlib.Path(__file__).resolve().parents[1] / "bert_jax" / "data" / "sample_public_domain.txt"
    ),
    str(out),
    max_seq_length=64,
    max_predictions_per_seq=10,
    dupe_factor=1,
    eval_fraction=0.05,
    num_workers=1,
    progress=False,
  )
  return str(out)


from slurm_cluster import slurm_cluster  # noqa: E402, F401  (a one-node SLURM: test_slurm.py)


@pytest.fixture
def built_replication_data(tmp_path):
  """A directory holding tools/replication/build_data.sh's outputs as placeholders, so that the
  replication scripts skip every data step (for dry runs and runs past their deadline)."""
  data = tmp_path / "data"
  for kind in ("nsp", "packed"):
    (data / kind).mkdir(parents=True)
    # What build_data.sh checks of pairs built before: its default passes and held-out share.
    (data / kind / "metadata.json").write_text('{"dupe_factor": 5, "eval_fraction": 0.05}')
  (data / "vocab.txt").write_text("[PAD]\n")
  (data / "corpus.txt").write_text("a b.\n")
  return data
