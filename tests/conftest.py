import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# seeded γ / tree choices read priors measured per CPU kind: pin the kind, so a test decides alike on any CPU
os.environ.setdefault("HFSPEC_CPU_KIND", "avx512")
# ...and the few-row verify kernel, which "auto" uses on AVX-512 and AMX kinds where the machine can build it: off
# unless a test turns it on (tests/test_verify_linear.py), so that the suite computes alike on any CPU
os.environ.setdefault("HFSPEC_ROWS_KERNEL", "off")
# ...and the saved cost profiles a seeded γ "auto" prices rounds with (`hfspec.decoding.profile`): an empty folder of
# the suite's own, so a profile the user measured never changes what a test decides
if "HFSPEC_PROFILE_DIR" not in os.environ:
    import tempfile

    os.environ["HFSPEC_PROFILE_DIR"] = tempfile.mkdtemp(prefix="hfspec-test-profiles-")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)  # tiny models: one thread is fastest and robust to a busy machine


@pytest.fixture(scope="module")
def compile_dir(tmp_path_factory):
    """One inductor folder per test module: later compiles of the same graph shapes in a module hit it."""
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture
def own_cache(compile_dir, monkeypatch):
    """Inductor's artefacts go to the module's folder (never the user's ~/.cache)."""
    from hfspec.kernels import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", compile_dir)
    return compile_dir


def shared_model(name: str) -> Path:
    """Path of a model under ../shared/models, or skip the test when it is absent."""
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is only on development machines)")
    return path

