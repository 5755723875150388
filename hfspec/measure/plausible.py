"""Checks of a measured figure against what its own passes allow: a speed-up above the bound or a c_time no draft
smaller than its target can have is flagged "implausible"; where the cost model's prediction falls outside the
measured interval, `disagreement` says which side differs and why; `ideal_note` explains a measurement above the
paper's ideal."""

from __future__ import annotations

import math

from hfspec.decoding.costmodel import from_pairs
from hfspec.decoding.stats import SpecStats
from hfspec.measure.verify_cost import verify_ratio

PLAUSIBLE_SLACK = 0.25  # a measured speed-up may exceed its bound by this share (timer noise) before it is flagged
C_TIME_MAX = 3.0  # a draft forward costing more target forwards than this (draft smaller than target): implausible


def speedup_bound(spec: SpecStats, plain: SpecStats | None = None) -> float | None:
    """The most a speculative run with these passes can gain: tokens per pass × (plain seconds / plain forward
    seconds) / (verify floor × (1 + γ̄·c_time)). A round costs at least one verify pass plus its draft forwards
    (c_time verify passes each), and a verify pass no less than `spec.verify_floor` plain steps (one with F.linear;
    less through the few-row kernel, which reads the weights faster than plain decoding's product); plain decoding
    pays its forward plus what it spends outside forwards per token, which a round could at best share. None when
    the passes do not say (nothing timed)."""
    if not spec.target_passes or not spec.time_target:
        return None
    overhead = plain.time_total / plain.time_target if plain is not None and plain.time_target > 0 else 1.0
    floor = min(1.0, max(0.1, spec.verify_floor))
    return spec.tokens_per_pass * max(1.0, overhead) / (floor * (1 + spec.mean_gamma * max(0.0, spec.c_time)))


def implausible(measured: float | None, spec: SpecStats | None, plain: SpecStats | None = None) -> list[str]:
    """Flags ("implausible: …") for a measured speed-up or c_time its own passes cannot produce; [] when the
    figure is possible."""
    if spec is None:
        return []
    flags = []
    c, cb = spec.c_time, spec.c_bytes
    if spec.draft_forwards and 0 < cb < 1 and c > C_TIME_MAX:
        flags.append(f"implausible: c_time {c:.1f} — a draft forward took {c:.1f} target forwards though the draft "
                     f"has {cb:.2f} of the target's bytes (its forwards were slowed while timed)")
    bound = speedup_bound(spec, plain)
    if measured and bound and measured > bound * (1 + PLAUSIBLE_SLACK):
        flags.append(f"implausible: measured {measured:.2f}× is above the {bound:.2f}× its own passes allow "
                     f"({spec.tokens_per_pass:.2f} tokens per pass, γ̄ {spec.mean_gamma:.1f}, c_time {c:.2f}"
                     + (f", a verify pass ≥ {spec.verify_floor:.2f} of a step" if spec.verify_floor < 1 else "")
                     + ") — "
                     "the plain runs were slowed, not the speculative ones sped up")
    if measured is not None and measured < 0:
        flags.append(f"implausible: measured {measured:.2f}× is negative")
    return flags


def has_prediction(stats: SpecStats | None) -> bool:
    """Whether a run has a cost-model prediction: only a draft with forwards to time has step costs to price
    (prompt lookup has none: its figure is "—", never a number)."""
    return stats is not None and bool(stats.draft_forwards)


def disagreement(m) -> str:
    """Why the predicted speed-up lies outside the measured interval ("" when it lies inside, or nothing to say):
    the side (speculative or plain) whose predicted tokens/s is further from the measured one, and whether the
    timings were unreliable or the cost model lacked a one-token timing."""
    if not m.speculative_runs or m.low is None or m.high is None:
        return ""

    if not has_prediction(m.speculative_runs[0]):
        return ""
    p = from_pairs(m.speculative_runs, m.plain_runs, new_tokens=m.tokens_per_row)
    if not p.speedup or m.low <= p.speedup <= m.high:
        return ""
    off = {"speculative": (p.speculative_tokens_per_second, m.speculative_tokens_per_second),
           "plain": (p.plain_tokens_per_second, m.plain_tokens_per_second)}
    side, (pred, meas) = max(off.items(), key=lambda kv: abs(math.log(kv[1][0] / kv[1][1]))
                             if kv[1][0] > 0 and kv[1][1] > 0 else 0.0)
    reasons = [f"the cost model gives {side} decoding {pred:.1f} tok/s against {meas:.1f} measured"]
    if side == "plain":
        reasons.append("plain runs spent time the model does not price (set-up outside the timed steps, "
                       "or load while they ran)")
    else:
        reasons.append("speculative rounds varied more than the fitted per-round costs (load, or rounds of "
                       "unusual length)")
    if "assumed" in p.source:
        reasons.append(p.source)
    if not m.reliable:
        reasons.append(f"the timings were {m.verdict}")
    return (f"predicted {p.speedup:.2f}× lies outside the measured {m.low:.2f}–{m.high:.2f}×: "
            + "; ".join(reasons))


def ideal_note(stats: SpecStats, measured: float | None) -> str:
    """What the ideal speed-up (paper's formula with c_bytes) means when the measured figure is above it ("" when
    it is not): it is no upper bound."""
    ideal = stats.ideal_speedup
    if not measured or not ideal or measured <= ideal:
        return ""
    verify = verify_ratio(stats, None)
    if verify is not None and verify < 1:
        why = (f"the target's verify pass costs {verify:.2f} of its one-token step (the formula counts a whole step; "
               "hfspec's few-row verify kernel reads the weights faster than plain decoding's product)")
    elif 0 < stats.c_time < stats.c_bytes:
        why = (f"the draft's forward costs less of the target's ({stats.c_time:.2f}) than its bytes "
               f"({stats.c_bytes:.2f})")
    else:
        why = "plain decoding pays per-token overhead outside forwards that a speculative round shares"
    return f"measured is above the ideal {ideal:.2f}×, which is no upper bound: {why}"
