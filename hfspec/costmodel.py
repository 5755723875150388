"""The import path `hfspec.costmodel` that hfspec 0.1's docs showed (`from hfspec.costmodel import predict`); the
module is `hfspec.decoding.costmodel`. Kept for code written against those docs."""

from hfspec.decoding.costmodel import *  # noqa: F403
from hfspec.decoding.costmodel import __all__  # noqa: F401
