"""Greedy γ policies compared away from the clock: replayed on which draft tokens the target keeps, priced by a cost
model measured beforehand.

At temperature 0 the text is the target's greedy text whatever γ is, and the draft proposes its own greedy token
after each prefix of that text. Which draft tokens a round keeps is therefore fixed before decoding: a round that
starts at new token i with γ k keeps min(L_i, k) of them, L_i being how many of the draft's next greedy tokens from
i equal the target's, and commits one token more. `draft_matches` finds, in two forwards (the target's greedy text,
then the draft over it), whether the draft's token equals the target's at each position; `replay` then runs a γ
policy (`hfspec.decoding.gamma`) round by round on them, as the decoding loop would, and prices each round with a
`CostModel`: its tokens per second with no timing noise at all. A seeded γ "auto" decides from acceptance counts
alone (`hfspec.api.seeded_gamma_policy`), so its replay makes the same choices as the real run (tests/test_replay.py
checks it against `hfspec.generate`).

Why: timed side by side, γ auto and a fixed γ differ by a few per cent, and a 2-core machine's rounds swing by more
(benchmarks/results/epyc-avx2-2c-2026-12-07-results-gamma-chunk12-float32.md: ±8-13 % intervals over 5 rounds of 4
prompts). A replay prices every policy on the same text and the same costs, so it can compare them over many
prompts in seconds; the costs themselves still come from timed rounds (benchmarks/bench_round_costs.py), and a
replay is only as right as they are. Sampled runs (T > 0) draw their tokens at random and cannot be replayed so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from hfspec.decoding.costmodel import CostModel
from hfspec.decoding.stopping import eos_id_list
from hfspec.errors import bad_value
from hfspec.validate import check_pair, vocab_size

# generation_config fields whose logits processors would change the target's greedy token (and the draft's
# proposal, which goes through the same processors in the loop); `draft_matches` applies only min_new_tokens' EOS
# mask, so a target with one of these set is refused by name rather than replayed wrongly
PROCESSOR_FIELDS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                    "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id",
                    "forced_eos_token_id", "exponential_decay_length_penalty")
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0}


def draft_matches(target, draft, input_ids: torch.Tensor, new_tokens: int) -> list[bool]:
    """Whether the draft's greedy token equals the target's at each of the `new_tokens` positions the target writes
    greedily after `input_ids` ([1, L]; EOS does not end it). `draft`: a draft model whose forward returns logits
    (a quantised copy, a sibling); prompt lookup has none and is refused by name, as is a pair `generate` refuses
    (`hfspec.validate.check_pair`) or a target whose generation config sets a logits processor (`PROCESSOR_FIELDS`).

    The draft runs one forward over the whole text, where the loop feeds it a token or a round at a time, through
    its lean or native step where it has one: the same maths, rounded in another order, so where two tokens nearly
    tie the argmax can differ now and then (SmolLM2 off the grid, gptq4-compiled: fixed-γ replays gave the real runs'
    tokens per pass to 0.01, while a γ auto replay's path through a prompt could differ from the real run's)."""
    if not isinstance(draft, torch.nn.Module) or not callable(getattr(draft, "forward", None)):
        raise bad_value("draft", type(draft).__name__, "a draft model with a forward returning logits")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise bad_value("input_ids", tuple(input_ids.shape), "one prompt, shape [1, L]")
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise bad_value("new_tokens", new_tokens, "an integer ≥ 1")
    config = target.generation_config
    for name in PROCESSOR_FIELDS:
        value = getattr(config, name, None)
        if value not in (None, _NEUTRAL.get(name), [], ()):
            raise bad_value(f"generation_config.{name}", value, "unset: a replay applies no logits processor "
                            "but min_new_tokens' EOS mask")
    vocab = check_pair(target, draft) or vocab_size(target)  # without a shared width the two sizes are equal
    with torch.no_grad():
        text = target.generate(input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               attention_mask=torch.ones_like(input_ids))
        out = draft(text.clamp(max=vocab_size(draft) - 1))  # as the loop: ids past the draft's rows are clamped
    logits = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(text.shape):
        raise bad_value("draft", type(draft).__name__, "a model whose forward returns logits for every position, "
                        "shape [1, L, vocab]")
    start = input_ids.shape[1]
    scores = logits[0, start - 1 : -1, :vocab].clone()
    # EOS cannot end the text before `new_tokens` (min_new_tokens), and the loop's draft proposes through the same
    # logits processors: its EOS is masked too
    scores[:, [e for e in eos_id_list(config.eos_token_id) if e < vocab]] = float("-inf")
    guesses = scores.argmax(-1)  # the draft's token for each new position
    return (guesses == text[0, start:]).tolist()


@dataclass
class Replay:
    """One policy replayed: its rounds' γ and kept draft tokens, the tokens made, and the seconds the cost model
    prices them at."""

    gammas: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Tokens per second (in the cost model's units: per target step where it is in steps)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / len(self.gammas) if self.gammas else 0.0

    def histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.gammas).items()))


def run_lengths(matches: list[bool]) -> list[int]:
    """L_i: how many draft tokens in a row from position i equal the target's."""
    out, run = [0] * len(matches), 0
    for i in range(len(matches) - 1, -1, -1):
        run = run + 1 if matches[i] else 0
        out[i] = run
    return out


def replay(matches: list[bool], policy, costs: CostModel) -> Replay:
    """Run `policy` (a fresh `GammaPolicy`: `next`, `observe`, `update`) over one greedy text whose positions the
    draft gets right where `matches` says, as `hfspec.decoding.loop` does: γ capped so the round does not pass the
    length, min(L_i, γ) draft tokens kept and one more committed, the policy told each round's counts (no times: a
    frozen policy reads none). Each round costs `costs.round_seconds(γ)` (γ 0: a plain round of the speculative loop,
through its target runner)."""
    lengths, out = run_lengths(matches), Replay()
    total, i = len(matches), 0
    while i < total:
        chosen = policy.next()
        gamma = max(0, min(chosen, total - i - 1))
        kept = min(lengths[i], gamma)
        checked = min(kept + 1, gamma)
        policy.observe([kept], [checked])
        if not (gamma == 0 and chosen > 0):
            policy.update(gamma, kept, checked, 0.0, 0.0)
        out.gammas.append(gamma)
        out.accepted.append(kept)
        out.seconds += costs.round_seconds(gamma)  # γ 0: a plain round of the speculative loop
        out.tokens += kept + 1
        i += kept + 1
    return out


__all__ = ["PROCESSOR_FIELDS", "Replay", "draft_matches", "replay", "run_lengths"]
