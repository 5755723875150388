"""Every old name of hfspec's speed-up figures, mapped to its new one: the one place that keeps them working.

Four names, one meaning each:

* `paper_speedup`: the paper's closed-form formula (1 − α^(γ+1)) / ((1 − α)(1 + γc)) (Leviathan et al. 2023,
  Thm 3.8) from α, γ and a cost ratio c (`hfspec.paper_speedup(α, γ, c)`; a run's with c = c_time).
* `predicted_speedup`: the cost model's prediction (`hfspec.decoding.costmodel`) from the measured step costs and the run's
  tokens per pass.
* `measured_speedup`: speculative over plain tokens/s, measured (`hfspec.measure`).
* `ideal_speedup`: the paper's formula with c = c_bytes, the weight-bound figure (`SpecStats.ideal_speedup`).

An old module-level function is a wrapper, an old attribute a property (added by `old_names`); both warn with a
`DeprecationWarning` that names the new name. Files written by hfspec carry the new keys only; `new_keys` reads
rows and dicts written with the old ones, and `RenamedKeys` lets code that indexes a returned dict by an old key
keep working (with the warning). Nothing here imports the rest of hfspec at import time (no cycles).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import warnings

# old module-level function -> (where users call it, the module of the new function, the new function)
FUNCTIONS = {
    "estimated_speedup": ("hfspec", "hfspec.decoding.stats", "paper_speedup"),  # also hfspec.decoding.stats.estimated_speedup
    "speedup_ignoring_verify_and_overhead": ("hfspec.decoding.stats", "hfspec.decoding.stats", "paper_speedup"),
}
# old attribute -> new attribute (SpecStats, RunResult, Measurement, SweepRow / CompareRow, LiveSnapshot)
ATTRIBUTES = {
    "estimated_speedup": "predicted_speedup",
    "estimated_speedup_sd": "predicted_speedup_sd",
}
# old CSV / JSON key -> new key (results, sweep and compare rows, the live series, dashboard exports)
KEYS = dict(ATTRIBUTES)


def _warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


def _function(old: str):
    public, module, new = FUNCTIONS[old]

    def wrapper(*args, **kwargs):
        _warn(f"{public}.{old}", f"hfspec.{new}")
        return getattr(importlib.import_module(module), new)(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = old
    wrapper.__doc__ = f"Deprecated: `hfspec.{new}` (same arguments, same value)."
    return wrapper


estimated_speedup = _function("estimated_speedup")
speedup_ignoring_verify_and_overhead = _function("speedup_ignoring_verify_and_overhead")


def _property(cls_name: str, old: str, new: str) -> property:
    def get(self):
        _warn(f"{cls_name}.{old}", f"{cls_name}.{new}")
        return getattr(self, new)

    return property(get, doc=f"Deprecated: `{new}`.")


def old_names(cls):
    """Class decorator: each old attribute of ATTRIBUTES whose new one `cls` has becomes a property that warns
    and returns the new one (a dataclass's fields count; put it above @dataclass)."""
    have = set(dir(cls)) | ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set())
    for old, new in ATTRIBUTES.items():
        if new in have:
            setattr(cls, old, _property(cls.__name__, old, new))
    return cls


def new_keys(row: dict) -> dict:
    """A row or dict read back from a file, with old keys under their new names (a new key already there wins)."""
    out = dict(row)
    for old, new in KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


class RenamedKeys(dict):
    """A dict with the new keys only, in which an old key still reads its new one's value, with the warning."""

    def __missing__(self, key):
        return self._old(key, 4)

    def get(self, key, default=None):
        if key not in self and key in KEYS and KEYS[key] in self:
            return self._old(key, 4)
        return super().get(key, default)

    def _old(self, key, stacklevel: int):
        if key in KEYS and KEYS[key] in self:
            _warn(f"the key {key!r}", repr(KEYS[key]), stacklevel)
            return self[KEYS[key]]
        raise KeyError(key)


def renamed_keys(function):
    """Decorator: the function's dict comes back as `RenamedKeys`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return RenamedKeys(function(*args, **kwargs))

    return wrapper
