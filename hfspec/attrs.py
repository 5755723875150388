"""What hfspec records on a model it did not define, in one place: the names and the namespace they live in.

    set_attr(draft, DRAFT_SPEC, "rtn4");  get_attr(draft, DRAFT_SPEC)  # -> "rtn4" (default None)
    has_attr(linear, PACKED);  del_attr(linear, PACKED)

The values live in one dict per object, `obj.__dict__["_hfspec"]`, never as attributes of their own: they do not
shadow a module's attributes, and they travel with the object where its `__dict__` does (`copy.deepcopy`,
pickling, `torch.save` of the module).

Hooks that hfspec's own classes define as methods are named here too (`DRAFT_HOOK`, `NEW_CACHE_HOOK`); `hook`
finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NAMESPACE = "_hfspec"

DRAFT_SPEC = "draft_spec"  # a draft built by `make_draft`: its spec's canonical label ("rtn4", "twin-x1")
STEP_PATH = "step_path"  # how a draft's decode step runs, for `describe` ("lean decode step ...")
CALIBRATION = "calibration"  # a calibrated draft: where its calibration came from ("calibrated in ...", "cache: ...")
FIDELITY = "fidelity"  # a draft's measured agreement with its target (`hfspec.drafts.fidelity`)
LAYER_PATH = "layer_path"  # a bitsandbytes layer: which kernel it runs ("bnb nf4 ...")
SHARED_VOCAB = "shared_vocab"  # a sibling draft: the vocabulary it shares with its target's tokenizer
LEAN_STEP = "lean_step"  # False: a draft model opts out of the lean decode step (`hfspec.kernels.lean`)
PACKED = "packed"  # an `nn.Linear`'s oneDNN-prepacked weight (`hfspec.kernels.fast_linear`)
# True: the target's verify passes compute `generate`'s one-token steps bit for bit
# (`hfspec.audit.exactness.use_bitwise_verify`), so no other linear path may run them (`hfspec.kernels.verify_linear`)
BITWISE_VERIFY = "bitwise_verify"

NAMES = (DRAFT_SPEC, STEP_PATH, CALIBRATION, FIDELITY, LAYER_PATH, SHARED_VOCAB, LEAN_STEP, PACKED, BITWISE_VERIFY)

DRAFT_HOOK = "hfspec_draft"  # method of a draft model with a `Draft` of its own: hfspec_draft(vocab) -> Draft
NEW_CACHE_HOOK = "hfspec_new_cache"  # method of a model with a cache of its own: hfspec_new_cache() -> cache

_PLAIN: dict[str, str] = {}  # names also written as a plain attribute, for a reader not yet moved here (none)


def _check(name: str) -> None:
    if name not in NAMES:
        raise KeyError(f"unknown hfspec attribute {name!r}; known: {', '.join(NAMES)}")


def set_attr(obj: Any, name: str, value: Any) -> None:
    """Record `value` under `name` on `obj` (any object with a `__dict__`)."""
    _check(name)
    obj.__dict__.setdefault(NAMESPACE, {})[name] = value
    if name in _PLAIN:
        object.__setattr__(obj, _PLAIN[name], value)


def get_attr(obj: Any, name: str, default: Any = None) -> Any:
    """The value recorded under `name` on `obj`, or `default`."""
    _check(name)
    space = getattr(obj, "__dict__", {}).get(NAMESPACE)
    return space.get(name, default) if space else default


def has_attr(obj: Any, name: str) -> bool:
    _check(name)
    return name in (getattr(obj, "__dict__", {}).get(NAMESPACE) or {})


def del_attr(obj: Any, name: str) -> None:
    """Forget `name` on `obj` (nothing happens when it was not recorded)."""
    _check(name)
    space = getattr(obj, "__dict__", {}).get(NAMESPACE)
    if space:
        space.pop(name, None)
    if name in _PLAIN:
        obj.__dict__.pop(_PLAIN[name], None)


def hook(obj: Any, name: str) -> Callable | None:
    """The hook method `name` (`DRAFT_HOOK`, `NEW_CACHE_HOOK`) of `obj`, or None."""
    if name not in (DRAFT_HOOK, NEW_CACHE_HOOK):
        raise KeyError(f"unknown hfspec hook {name!r}")
    found = getattr(obj, name, None)
    return found if callable(found) else None
