"""The one registry of draft kinds: how a spec string reads, what it is called, how it is built.

Every front end (API, CLI, presets, dashboard) parses, labels, builds and lists drafts through here. A kind
says everything about itself in one module, as its `KIND`:

    KIND = DraftKind(name="lookup", title="prompt lookup (n-gram copy)", parse=..., build=..., fields=...)

and the built-in kinds are the modules listed in `BUILTIN`. A kind defined elsewhere (a plug-in, a test) is
one `register(DraftKind(...))` call.

A kind's `fields` describe its parameters for forms (the dashboard builds its widgets from them);
`spec_of(kind, values)` and `fields_of(spec)` convert between a spec string and those values.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from hfspec.errors import HfspecError


@dataclass(frozen=True)
class DraftSpec:
    """A parsed draft spec. kind: a registered kind's name, or "model" for a model object."""

    kind: str
    bits: int | None = None
    group_size: int | None = None
    bnb_type: str | None = None
    source: object = None
    params: tuple = ()  # extra (name, value) pairs of kinds that need them

    @property
    def label(self) -> str:
        """Canonical spelling, e.g. "rtn4-g32", "bnb-nf4", "lookup-n3", or the sibling's source."""
        if self.kind == "model":
            return type(self.source).__name__
        return KINDS[self.kind].label(self)

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class Field:
    """One parameter of a draft kind, for forms: an int range, a choice, or free text (a path / hub id)."""

    name: str
    title: str
    default: object
    choices: tuple = ()
    low: int | None = None
    high: int | None = None
    text: bool = False


@dataclass(frozen=True)
class DraftKind:
    """A kind of draft. `parse(text, low)` returns a DraftSpec when the text is this kind's (raising HfspecError
    when it is this kind's but malformed) and None when it is not; `build(target, spec, options)` returns the
    draft model; `options` lists the keyword options `make_draft` passes through.

    label: the canonical spelling of a parsed spec; fields / spec_of / values: the kind's form (its parameters,
    a spec string from form values, form values from a parsed spec; default: the spec's params);
    copies_target: a copy of the target's own weights (make_draft warns when it strays far from the target);
    names_model: the spec names a model to load (a folder or hub id): tried last, as the catch-all, and given
    the target's tokenizer to check; assisted(target, draft, spec, gamma): the keyword arguments and a label
    with which transformers' assisted generation runs this kind (None: the draft model itself as
    `assistant_model`, when it has `generate`); examples: specs to show and test.
    """

    name: str
    title: str
    allowed: str
    parse: Callable[[str, str], DraftSpec | None]
    build: Callable[..., nn.Module]
    label: Callable[[DraftSpec], str]
    fields: tuple[Field, ...] = ()
    spec_of: Callable[[dict], str] | None = None
    values: Callable[[DraftSpec], dict] | None = None
    options: frozenset | None = field(default_factory=frozenset)  # None: any option goes to `build`
    copies_target: bool = False
    names_model: bool = False
    assisted: Callable[..., tuple[dict, str] | None] | None = None
    examples: tuple[str, ...] = ()


# The modules of the built-in kinds, each defining `KIND`, in display order (a kind naming a model goes last).
BUILTIN = ("hfspec.drafts.rtn", "hfspec.drafts.calibrated", "hfspec.drafts.bnb", "hfspec.drafts.int8", "hfspec.drafts.mixed", "hfspec.drafts.lookup", "hfspec.drafts.sibling")

KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    """Add a draft kind after the built-in ones (kinds that name a model stay last: they catch every folder
    and hub id)."""
    _ensure_builtin()
    KINDS[kind.name] = kind
    for name in [k.name for k in KINDS.values() if k.names_model and k.name != kind.name]:
        KINDS[name] = KINDS.pop(name)
    return kind


def unregister(name: str) -> None:
    """Remove a kind added by `register`."""
    KINDS.pop(name, None)


def model_kind() -> DraftKind:
    """The kind whose specs name a model to load (a folder or hub id)."""
    return next(k for k in choices() if k.names_model)


def allowed() -> str:
    """The allowed spellings of every kind, for error messages."""
    _ensure_builtin()
    parts = [k.allowed for k in KINDS.values()]
    return ", ".join(parts[:-1]) + (", or " if len(parts) > 1 else "") + parts[-1]


def fail(why: str) -> HfspecError:
    return HfspecError(f"draft: {why}; allowed specs: {allowed()}")


def parse(spec) -> DraftSpec:
    """Read a draft spec (string, path or model); raise HfspecError naming the field and the allowed specs."""
    _ensure_builtin()
    if isinstance(spec, DraftSpec):
        return spec
    if isinstance(spec, nn.Module):
        return DraftSpec("model", source=spec)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise fail(f"expected a spec string or a model, got {spec!r}")
    text = spec.strip()
    for kind in KINDS.values():
        parsed = kind.parse(text, text.lower())
        if parsed is not None:
            return parsed
    raise fail(f"unknown spec {text!r}")


def kind_of(spec) -> DraftKind | None:
    """The registered kind of a spec (None for a model object)."""
    parsed = parse(spec)
    return KINDS.get(parsed.kind)


def choices() -> list[DraftKind]:
    """Registered kinds in display order."""
    _ensure_builtin()
    return list(KINDS.values())


def spec_of(kind: str, values: dict) -> str:
    """The spec string for a form's values of `kind` (checked by parsing it)."""
    _ensure_builtin()
    if kind not in KINDS:
        raise HfspecError(f"draft kind: got {kind!r}; allowed: {', '.join(KINDS)}")
    entry = KINDS[kind]
    text = entry.spec_of(values) if entry.spec_of else str(values.get("source", "")).strip()
    parse(text)
    return text


def fields_of(spec: str) -> dict:
    """The form values of a spec string: {"kind": name, field: value, ...} (defaults for other kinds' fields)."""
    parsed = parse(spec)
    out = {"kind": parsed.kind}
    for kind in KINDS.values():
        for f in kind.fields:
            out.setdefault(f.name, f.default)
    kind = KINDS.get(parsed.kind)
    if kind is not None and kind.values is not None:
        out.update(kind.values(parsed))
    out.update(dict(parsed.params))
    return out


_LOADED = False


def load_builtin() -> None:
    """Register the built-in kinds (once), in `BUILTIN`'s order, ahead of any kind registered earlier;
    `hfspec.drafts` calls it on import."""
    _ensure_builtin()


def _ensure_builtin() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    added = dict(KINDS)
    KINDS.clear()
    for module in BUILTIN:
        kind = importlib.import_module(module).KIND
        KINDS[kind.name] = kind
    for kind in added.values():
        register(kind)
