"""hfspec's optional extras (pyproject's [project.optional-dependencies]): one check and one message, naming the
extra to install, for every path that needs one (CLI verbs and the API alike)."""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import PackageNotFoundError, version

from hfspec.errors import HfspecError

# extra -> (import name, distribution name) of each package it installs
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "gui": (("PySide6", "PySide6-Essentials"), ("pyqtgraph", "pyqtgraph")),
    "bnb": (("bitsandbytes", "bitsandbytes"),),
    "gguf": (("gguf", "gguf"),),
    "export": (("compressed_tensors", "compressed-tensors"),),
    "plot": (("matplotlib", "matplotlib"),),
}


def missing_extra(extra: str, field: str, purpose: str, package: str | None = None) -> HfspecError:
    """The error for a missing extra: the field, what needed it, the package and the pip command."""
    packages = package or "' and '".join(dist for _, dist in EXTRAS[extra])
    return HfspecError(f"{field}: {purpose} needs the '{packages}' package, which is not installed (hfspec's "
                       f"optional extra {extra!r}); allowed: pip install 'hfspec[{extra}]'")


def require_extra(extra: str, field: str, purpose: str) -> None:
    """Import every package of `extra`; HfspecError naming `field`, `purpose` and the extra when one is missing."""
    for module, dist in EXTRAS[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"no module named {module!r}")
            importlib.import_module(module)
        except (ImportError, ValueError) as error:  # ValueError: find_spec of a module without a spec
            raise missing_extra(extra, field, purpose, dist) from error


def extra_version(extra: str, field: str, purpose: str) -> str:
    """The installed version of the (first) package of `extra`, or the same HfspecError when it is missing."""
    dist = EXTRAS[extra][0][1]
    require_extra(extra, field, purpose)
    try:
        return version(dist)
    except PackageNotFoundError as error:
        raise missing_extra(extra, field, purpose, dist) from error
