"""The mixed 4/8-bit draft kind: an RTN copy with chosen units at int8 (`rtn4+int8:head`, `rtn4+int8:L0-L3,head`,
`rtn3-g64+int8:L0,L29-top0-compiled`).

    rtnB[-gN]+int8:UNITS[-topK][-compiled]      UNITS: comma-separated head, L<i> (decoder layer i), L<i>-L<j>

Every other matrix is rtnB-gN as in `hfspec.drafts.rtn`; the listed units are per-channel int8 (`hfspec.drafts.int8`,
one byte a weight plus a bf16 scale a row) on the same lean step. Which units to give 8 bits: the ones
`hfspec sensitivity` ranks first (`hfspec.drafts.sensitivity`, by layer: the head and a few layers usually carry
most of a low-bit draft's loss). Needs the lean step and the int8 kernel, like `int8`.
"""

from __future__ import annotations

import re

from torch import nn

from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.drafts.rtn import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    HEAD_DEFAULT,
    RTN_BITS,
    SPECS,
    STEPS,
    GroupSpecs,
    _step_suffix,
    _top_suffix,
)
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.kernels.lean import HEAD_TOP_MAX, LeanDecoder, _decoder, lean_reason
from hfspec.quant import int8

NAME = "mixed"
_UNIT = r"(?:head|l\d+(?:-l\d+)?)"
_PATTERN = re.compile(rf"rtn(\d+)(?:-g(\d+))?\+int8:({_UNIT}(?:,{_UNIT})*)(?:-top(\d+))?(-compiled)?")
ALLOWED = "rtnB[-gN]+int8:UNITS[-topK][-compiled] (UNITS: head, Li, Li-Lj)"


def _units(text: str) -> tuple:
    """"head,l0-l2,l5" -> ("head", 0, 1, 2, 5) (sorted, once each; the head first)."""
    out: set = set()
    for part in text.split(","):
        if part == "head":
            out.add("head")
            continue
        ends = [int(x[1:]) for x in part.split("-")]
        if ends[-1] < ends[0]:
            raise fail(f"int8 layer range {part.upper()} runs backwards (write Li-Lj with i ≤ j)")
        out.update(range(ends[0], ends[-1] + 1))
    return (("head",) if "head" in out else ()) + tuple(sorted(u for u in out if u != "head"))


def _parse(text: str, low: str) -> DraftSpec | None:
    if not (low.startswith("rtn") and "+" in low):
        return None
    match = _PATTERN.fullmatch(low)
    if not match:
        raise fail(f"cannot read {text!r} (write rtnB[-gN]+int8:UNITS, UNITS a comma-separated list of head, Li "
                   "and Li-Lj, optionally -topK, optionally ending in -compiled, e.g. rtn4+int8:head, "
                   "rtn4+int8:L0-L3,head-compiled)")
    bits = int(match.group(1))
    if not RTN_BITS[0] <= bits <= RTN_BITS[1]:
        raise fail(f"bits must be {RTN_BITS[0]}..{RTN_BITS[1]}, got {bits}")
    group = int(match.group(2)) if match.group(2) else DEFAULT_GROUP_SIZE
    if not GROUP_SIZES[0] <= group <= GROUP_SIZES[1]:
        raise fail(f"group size must be {GROUP_SIZES[0]}..{GROUP_SIZES[1]}, got {group}")
    params: tuple = (("int8", _units(match.group(3))),)
    if match.group(4) is not None:
        top = int(match.group(4))
        if top > HEAD_TOP_MAX:
            raise fail(f"-topK (head logits re-scored) must be 0..{HEAD_TOP_MAX}, got {top}")
        params += (("head_top", top),)
    if match.group(5):
        params += (("step", "compiled"),)
    return DraftSpec(NAME, bits=bits, group_size=group, params=params)


def _units_text(units: tuple) -> str:
    """("head", 0, 1, 2, 5) -> "head,L0-L2,L5"."""
    parts = ["head"] if "head" in units else []
    layers = [u for u in units if u != "head"]
    run: list[int] = []
    for i in layers + [None]:
        if run and (i is None or i != run[-1] + 1):
            parts.append(f"L{run[0]}" if len(run) == 1 else f"L{run[0]}-L{run[-1]}")
            run = []
        if i is not None:
            run.append(i)
    return ",".join(parts)


def _label(spec: DraftSpec) -> str:
    return (f"rtn{spec.bits}-g{spec.group_size}+int8:{_units_text(spec.param('int8'))}"
            + _top_suffix(spec.param("head_top")) + _step_suffix(spec.param("step", STEPS[0])))


def make_mixed_draft(target: nn.Module, bits: int, group_size: int, units: tuple, compiled: bool = False,
                     progress=None, head_top: int | None = None) -> nn.Module:
    """An rtn`bits`-g`group_size` lean draft of `target` with `units` ("head" and layer indices) per-channel int8."""
    why = lean_reason(target) or int8.kernel_reason()
    if why is not None:
        raise HfspecError(f"draft: a mixed rtn/int8 draft needs the lean step and the CPU int8 kernel, which "
                          f"{type(target).__name__} cannot take ({why}); allowed: rtn{bits}-g{group_size}")
    layers = len(_decoder(target)[1])
    beyond = [u for u in units if u != "head" and u >= layers]
    if beyond:
        raise HfspecError(f"draft: int8 unit L{beyond[0]} is not a layer of this target; allowed: head, "
                          f"L0..L{layers - 1}")
    memory.check_draft_fits(target, bits, group_size)
    formats = {u: (8, int8.PER_CHANNEL) for u in units}
    draft = LeanDecoder(target, bits, group_size, progress=progress, head_top=head_top, formats=formats)
    if compiled:
        draft.compile_step(progress)
    return draft


def _build(target, spec: DraftSpec, options: dict):
    return make_mixed_draft(target, spec.bits, spec.group_size, spec.param("int8"),
                            compiled=spec.param("step") == "compiled", **GroupSpecs.options(spec, options))


def _spec_of(values: dict) -> str:
    base = SPECS.spec_of({**values, "step": STEPS[0], "head_top": HEAD_DEFAULT})
    units = str(values.get("int8_units") or "head").strip()
    top = values.get("head_top")
    return (f"{base}+int8:{units}" + _top_suffix(None if top in (None, "", HEAD_DEFAULT) else top)
            + _step_suffix(values.get("step") or STEPS[0]))


KIND = DraftKind(
    name=NAME, title="RTN copy with chosen units at int8", allowed=ALLOWED,
    parse=_parse, build=_build, label=_label,
    fields=(*SPECS.fields()[:2], Field("int8_units", "units at int8", "head", choices=("head", "L0", "L0,head")),
            *SPECS.fields()[2:]),
    spec_of=_spec_of,
    values=lambda s: {"bits": s.bits, "group": s.group_size, "int8_units": _units_text(s.param("int8")),
                      "step": s.param("step", STEPS[0])},
    options=frozenset({"progress", "head_top"}), copies_target=True,
    examples=("rtn4+int8:head", "rtn4+int8:L0-L1,head", "rtn3-g64+int8:L0-compiled"),
)
