"""What a decoding round cost, measured: `RoundMeter` times each round into a `CostRecord`.

A round's seconds are split by what it did: the target pass (indexed by its width, positions per row), the
draft's forwards, and the time outside forwards (indexed by the draft tokens proposed), with the parts of that
outside time spent picking draft tokens and scoring the target's positions; round 0, the prompt's prefill, is
kept apart. `time_one_token_steps` times one-token target passes after a run with fewer than two of its own, for
the first `TIMED_RUNS` such runs of a target at a thread count and context size; later runs reuse those timings and
cost nothing extra. The model fitted to these records, and its predictions, are `hfspec.decoding.costmodel`'s.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import asdict, dataclass, field, fields

import torch

ONE_TOKEN_TIMINGS = 2  # one-token target passes timed after a run that had fewer of its own
TIMED_RUNS = 3  # runs of a target (per thread count and context size) that time them; later runs reuse the mean
_STEP_TIMINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(threads, context): [s, n, runs]}


@dataclass
class RoundSeconds:
    """Where one round's seconds went: the draft's forwards, the target's pass, the time outside forwards
    (`other`), and the parts of `other` spent turning draft logits into tokens (`pick`) and scoring the target's
    positions (`score`)."""

    draft: float
    target: float
    other: float
    pick: float = 0.0
    score: float = 0.0


@dataclass
class CostRecord:
    """Seconds spent per round, summed, by what the round did (round 0, the prefill, apart).

    Indexed by width n (positions per row the target pass fed): `width_rounds`, `width_seconds` (target).
    Indexed by k (draft tokens proposed): `gamma_rounds`, `gamma_draft_seconds`, `gamma_other_seconds`
    (outside forwards, live-display callbacks excluded), `gamma_rows` (active rows, summed), `gamma_pick_seconds`
    (the part of the outside time spent turning draft logits into tokens, which grows with k),
    `gamma_score_seconds` (the part spent scoring and verifying the k + 1 target positions), `gamma_accepted`
    (draft tokens accepted, summed over rows).
    Round 0 (the prompt's prefill, with a speculative run's first draft and verify): `prefill_rounds`,
    `prefill_gamma`, its seconds by part (`prefill_seconds` their sum) and `prefill_tokens`, the tokens it committed.
    `step_seconds` / `steps`: one-token target passes timed after the run (outside its total time), or, when
    `steps_reused` (of them) is set, the mean of earlier runs' timings of the same target reused.
    """

    width_rounds: list[int] = field(default_factory=list)
    width_seconds: list[float] = field(default_factory=list)
    gamma_rounds: list[int] = field(default_factory=list)
    gamma_draft_seconds: list[float] = field(default_factory=list)
    gamma_other_seconds: list[float] = field(default_factory=list)
    gamma_rows: list[int] = field(default_factory=list)
    gamma_pick_seconds: list[float] = field(default_factory=list)
    gamma_score_seconds: list[float] = field(default_factory=list)
    gamma_accepted: list[int] = field(default_factory=list)
    prefill_rounds: int = 0
    prefill_gamma: int = 0
    prefill_target_seconds: float = 0.0
    prefill_draft_seconds: float = 0.0
    prefill_other_seconds: float = 0.0
    prefill_tokens: int = 0
    step_seconds: float = 0.0
    steps: int = 0
    steps_reused: int = 0

    @property
    def prefill_seconds(self) -> float:
        """The prefill rounds' whole time: target, draft and what lay between them."""
        return self.prefill_target_seconds + self.prefill_draft_seconds + self.prefill_other_seconds

    def record(self, k: int, width: int, rows: int, seconds: RoundSeconds, *, prefill: bool,
               accepted: int = 0, tokens: int = 0) -> None:
        """One round: k draft tokens proposed, the target fed `width` positions per row over `rows` rows, its
        time split as `seconds` says; `accepted`: draft tokens kept, summed over rows; `tokens`: the tokens it
        committed, summed over rows (kept for the prefill round: a run timed from the end of its prefill round
        counts the tokens after it)."""
        if prefill:
            self.prefill_rounds += 1
            self.prefill_tokens += tokens
            self.prefill_gamma = k
            self.prefill_target_seconds += seconds.target
            self.prefill_draft_seconds += seconds.draft
            self.prefill_other_seconds += seconds.other
            return
        _add(self.width_rounds, width, 1)
        _add(self.width_seconds, width, seconds.target)
        _add(self.gamma_rounds, k, 1)
        _add(self.gamma_draft_seconds, k, seconds.draft)
        _add(self.gamma_other_seconds, k, seconds.other)
        _add(self.gamma_rows, k, rows)
        _add(self.gamma_pick_seconds, k, seconds.pick)
        _add(self.gamma_score_seconds, k, seconds.score)
        _add(self.gamma_accepted, k, accepted)

    @property
    def rounds(self) -> int:
        return sum(self.gamma_rounds)

    def merge(self, other: CostRecord) -> CostRecord:
        out = CostRecord()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                n = max(len(a), len(b))
                setattr(out, f.name, [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)),
                                                            strict=True)])
            elif f.name == "prefill_gamma":
                out.prefill_gamma = b if other.prefill_rounds else a
            else:
                setattr(out, f.name, a + b)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> CostRecord | None:
        if data is None:
            return None
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _add(values: list, index: int, amount) -> None:
    if len(values) <= index:
        values.extend([0] * (index + 1 - len(values)))
    values[index] += amount


class RoundMeter:
    """Times one round of the decoding loop into a `CostRecord`: call `begin(rows)` when the round starts, wrap
    live-display callbacks in `excluded()`, and `end(k, accepted)` when the round (rollback included) is over."""

    def __init__(self, record: CostRecord, target_runner, draft):
        self.record, self.target, self.draft = record, target_runner, draft
        self.rounds = 0

    def begin(self, rows: int) -> None:
        self._rows = rows
        self._began = time.perf_counter()
        self._excluded = 0.0
        self._t = self.target.seconds
        self._t_fed = self.target.positions_fed
        self._d = self.draft.seconds
        self._pick = self._score = 0.0

    def scoring(self) -> None:
        """The target's logits are in: scoring and verification start."""
        self._score_began = time.perf_counter()

    def scored(self) -> None:
        self._score += time.perf_counter() - self._score_began

    def timed(self, pick):
        """`pick` with its time added to the round's draft-token overhead."""
        def timed_pick(*args):
            began = time.perf_counter()
            try:
                return pick(*args)
            finally:
                self._pick += time.perf_counter() - began
        return timed_pick

    def add_pick(self, seconds: float) -> None:
        """Add `seconds` of per-token bookkeeping outside `timed` picks (a token tree's growing) to the round's
        draft-token overhead."""
        self._pick += seconds

    def excluded(self):
        meter = self

        class _Pause:
            def __enter__(self):
                self.began = time.perf_counter()

            def __exit__(self, *exc):
                meter._excluded += time.perf_counter() - self.began
                return False

        return _Pause()

    def end(self, k: int, accepted: int = 0, tokens: int = 0) -> None:
        rows = self._rows
        wall = time.perf_counter() - self._began - self._excluded
        target_s = self.target.seconds - self._t
        draft_s = self.draft.seconds - self._d
        width = (self.target.positions_fed - self._t_fed) // max(1, rows)
        seconds = RoundSeconds(draft_s, target_s, max(0.0, wall - target_s - draft_s), self._pick, self._score)
        self.record.record(k, width, rows, seconds, prefill=self.rounds == 0, accepted=accepted, tokens=tokens)
        self.rounds += 1


def time_one_token_steps(record: CostRecord, target_runner, slots, count: int = ONE_TOKEN_TIMINGS) -> None:
    """After a run: time `count` one-token target passes over the last committed token (which the target has
    not seen), rolling back after each, unless the run already had `count` one-position rounds of its own. The
    target's seconds and forwards counters are left as they were, and the caller's total time excludes this.

    A target's first `TIMED_RUNS` runs at a thread count and context size (rounded up to a power of two) time
    the passes; later ones record the mean of those timings as `steps_reused` and run no extra pass."""
    if len(record.width_rounds) > 1 and record.width_rounds[1] >= count:
        return
    cached = getattr(target_runner, "cached", None)
    if cached is None or cached != slots.size - 1 or slots.size < 1:
        return
    memo = _timings(getattr(target_runner, "model", None), slots.size)
    if memo is not None and memo[2] >= TIMED_RUNS:
        record.step_seconds += memo[0] / memo[1] * count
        record.steps += count
        record.steps_reused += count
        return
    saved = (target_runner.seconds, target_runner.forwards, target_runner.positions_fed)
    began_all = record.step_seconds
    for _ in range(count):
        began = time.perf_counter()
        target_runner.feed(slots.tokens, slots.positions, slots.valid, slots.size, 1, slots.all_valid)
        record.step_seconds += time.perf_counter() - began
        record.steps += 1
        target_runner.rollback(slots.size - 1)
    target_runner.seconds, target_runner.forwards, target_runner.positions_fed = saved
    if memo is not None:
        memo[0] += record.step_seconds - began_all
        memo[1] += count
        memo[2] += 1


def _timings(model, context: int) -> list | None:
    """The memo [seconds, passes, runs] of `model`'s one-token timings at this thread count and context size."""
    if model is None:
        return None
    try:
        table = _STEP_TIMINGS.setdefault(model, {})
    except TypeError:  # not weak-referenceable: time every run
        return None
    return table.setdefault((torch.get_num_threads(), max(1, context - 1).bit_length()), [0.0, 0, 0])
