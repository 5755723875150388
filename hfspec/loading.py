"""The import path `hfspec.loading` that hfspec 0.1's docs showed (`from hfspec.loading import load_model`); the
module is `hfspec.io.loading`. Kept for code written against those docs; new code imports `hfspec.io.loading`."""

from hfspec.io.loading import *  # noqa: F403
from hfspec.io.loading import __all__  # noqa: F401
