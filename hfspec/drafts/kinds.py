"""The built-in draft kinds: RTN and bitsandbytes copies of the target, and sibling models.

Prompt lookup registers itself from its own module (`hfspec.drafts.lookup`).
"""

from __future__ import annotations

import os
import re

from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail, register

BNB_KINDS = ("nf4", "fp4", "int8")
DEFAULT_GROUP_SIZE = 32
RTN_BITS = (2, 8)
GROUP_SIZES = (8, 8192)
_RTN = re.compile(r"rtn(\d+)(?:-g(\d+))?(-compiled)?")
STEPS = ("eager", "compiled")  # how an RTN draft's lean one-token step runs
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name


def _parse_rtn(text: str, low: str) -> DraftSpec | None:
    if not low.startswith("rtn"):
        return None
    match = _RTN.fullmatch(low)
    if not match:
        raise fail(f"cannot read {text!r} (write rtnB, rtnB-gN, optionally ending in -compiled, e.g. rtn4, "
                   "rtn3-g64, rtn4-compiled)")
    bits = int(match.group(1))
    if not RTN_BITS[0] <= bits <= RTN_BITS[1]:
        raise fail(f"bits must be {RTN_BITS[0]}..{RTN_BITS[1]}, got {bits}")
    group = int(match.group(2)) if match.group(2) else DEFAULT_GROUP_SIZE
    if not GROUP_SIZES[0] <= group <= GROUP_SIZES[1]:
        raise fail(f"group size must be {GROUP_SIZES[0]}..{GROUP_SIZES[1]}, got {group}")
    return DraftSpec("rtn", bits=bits, group_size=group, params=(("step", "compiled"),) if match.group(3) else ())


def _step_suffix(step: str) -> str:
    """How a spec string ends for a step: "-compiled" or nothing."""
    return "-compiled" if step == "compiled" else ""


def _build_rtn(target, spec: DraftSpec, options: dict):
    from hfspec.drafts.fast import make_rtn_draft

    return make_rtn_draft(target, spec.bits, spec.group_size, compiled=spec.param("step") == "compiled", **options)


def _rtn_spec(values: dict) -> str:
    group = int(values.get("group") or DEFAULT_GROUP_SIZE)
    step = values.get("step") or STEPS[0]
    if step not in STEPS:
        raise fail(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    return f"rtn{int(values['bits'])}" + (f"-g{group}" if group != DEFAULT_GROUP_SIZE else "") + _step_suffix(step)


def _rtn_label(spec: DraftSpec) -> str:
    return f"rtn{spec.bits}-g{spec.group_size}" + _step_suffix(spec.param("step", STEPS[0]))


def _parse_bnb(text: str, low: str) -> DraftSpec | None:
    if not low.startswith("bnb"):
        return None
    kind = low[4:] if low[3:4] in "-_" else ""
    if kind not in BNB_KINDS:
        raise fail(f"unknown bitsandbytes type {text!r} (allowed: {', '.join('bnb-' + k for k in BNB_KINDS)})")
    return DraftSpec("bnb", bnb_type=kind)


def _build_bnb(target, spec: DraftSpec, options: dict):
    from hfspec.drafts.bnb import make_bnb_draft

    return make_bnb_draft(target, spec.bnb_type)


def _parse_sibling(text: str, low: str) -> DraftSpec | None:
    path = os.path.expanduser(text)
    if os.path.exists(path):
        return DraftSpec("sibling", source=path)
    if _HUB_ID.fullmatch(text):
        return DraftSpec("sibling", source=text)
    if text.startswith((".", "/", "~")) or "/" in text or os.sep in text:
        raise fail(f"folder {text!r} not found")
    return None


def _build_sibling(target, spec: DraftSpec, options: dict):
    from hfspec.drafts.sibling import load_sibling

    return load_sibling(target, spec.source, **options)


RTN = register(DraftKind(
    name="rtn", title="quantised copy (RTN)", allowed=f"rtn{RTN_BITS[0]}..rtn{RTN_BITS[1]}[-gN][-compiled]",
    parse=_parse_rtn, build=_build_rtn, label=_rtn_label,
    fields=(Field("bits", "bits", 4, low=RTN_BITS[0], high=RTN_BITS[1]),
            Field("group", "group size", DEFAULT_GROUP_SIZE, choices=(32, 64, 128, 256)),
            Field("step", "draft step", STEPS[0], choices=STEPS)),
    spec_of=_rtn_spec, options=frozenset({"fused", "lean", "progress"}),
    examples=("rtn4", "rtn3", "rtn8", "rtn4-g64", "rtn4-compiled"),
))
BNB = register(DraftKind(
    name="bnb", title="quantised copy (bitsandbytes)", allowed=", ".join("bnb-" + k for k in BNB_KINDS),
    parse=_parse_bnb, build=_build_bnb, label=lambda s: f"bnb-{s.bnb_type}",
    fields=(Field("bnb_type", "type", "nf4", choices=BNB_KINDS),),
    spec_of=lambda values: f"bnb-{values['bnb_type']}", examples=tuple("bnb-" + k for k in BNB_KINDS),
))
SIBLING = register(DraftKind(
    name="sibling", title="smaller sibling model", allowed="a model folder / hub id",
    parse=_parse_sibling, build=_build_sibling, label=lambda s: str(s.source),
    fields=(Field("source", "folder or hub id", "", text=True),),
    spec_of=lambda values: str(values.get("source", "")).strip(),
    options=None,
    copies_target=False,
))

import hfspec.drafts.lookup  # noqa: E402,F401  (registers the prompt-lookup kind)
