"""`hfspec profile`: measure a pair's cost profile on this machine and save it, so that a seeded γ "auto" prices
its rounds with this machine's costs instead of the priors (`hfspec.decoding.profile` says why and how it is
keyed and used).

What is timed: the pair's own speculative rounds at each fixed γ of `gammas` (so the draft's seconds per round and
the verify pass at each width k + 1 are what decoding spends, not a forward timed alone, which on these CPUs reads
a few per cent cheaper), with plain decoding through the same loop (its one-token step and the time outside
forwards) after every other γ's run, so that the machine's drift falls on both sides; a first turn warms up (a
compiled draft compiles there) and is not counted: the first plain runs after loading timed 42.6 ms a step where
the later ones took 31–33 (SmolLM2-135M fp32, 6 December 2026). Once per
sampling mode asked for: greedy and sampled rounds differ in the time outside forwards. The records are saved, not a
fit, so a later hfspec refits them with its own model."""

from __future__ import annotations

from collections.abc import Callable

from hfspec.api import generate, plain_generate, profile_key
from hfspec.decoding.costrecord import CostRecord
from hfspec.decoding.profile import CostProfile, describe, now, save
from hfspec.errors import bad_value
from hfspec.validate import check_count

DEFAULT_GAMMAS = (2, 3, 4, 5, 6, 7)
DEFAULT_TEMPERATURES = (0.0, 1.0)


def parse_temperatures(text: str) -> list[float]:
    """--temperatures: comma-separated numbers ≥ 0 ("0,1")."""
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise bad_value("temperatures", text, "comma-separated numbers ≥ 0, e.g. 0,1") from None


def check_profile_arguments(gammas, temperatures, max_new_tokens: int, repeats: int) -> None:
    """The arguments of `measure_profile`, refused by name before any model runs."""
    if not gammas or any(not isinstance(g, int) or isinstance(g, bool) or not 1 <= g <= 16 for g in gammas):
        raise bad_value("gammas", gammas, "integers from 1 to 16, at least one (e.g. 2-7)")
    if not temperatures or any(not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0 for t in temperatures):
        raise bad_value("temperatures", temperatures, "numbers ≥ 0, at least one (0: greedy rounds; > 0: sampled)")
    if len({t > 0 for t in temperatures}) < len(temperatures):
        raise bad_value("temperatures", temperatures, "at most one 0 and one > 0 (a profile is kept per greedy or "
                        "sampled rounds, not per temperature)")
    check_count("max_new_tokens", max_new_tokens, 8)
    check_count("repeats", repeats, 1)


def measure_profile(target, draft, input_ids, gammas=DEFAULT_GAMMAS, temperatures=DEFAULT_TEMPERATURES,
                    max_new_tokens: int = 64, repeats: int = 2, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> list[tuple[CostProfile, str]]:
    """Time `draft` against `target` on `input_ids` (one prompt) at each γ of `gammas` and plain decoding,
    `repeats` times each, once per temperature; save each profile (`hfspec.decoding.profile.save`) and return
    [(profile, saved path)]. Every run makes exactly `max_new_tokens` tokens (EOS does not end it)."""
    check_profile_arguments(gammas, temperatures, max_new_tokens, repeats)
    gammas, temperatures = [int(g) for g in gammas], [float(t) for t in temperatures]
    say = progress or (lambda _text: None)
    out, measured = [], []
    for temperature in temperatures:
        sampled = temperature > 0
        sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens}
        if sampled:
            sampling.update(top_k=0, top_p=1.0)

        def spec(gamma: int, r: int, sampling=sampling):
            return generate(target, input_ids, draft=draft, gamma=gamma, seed=seed + r + 1, **sampling).stats

        def plain(r: int, sampling=sampling):
            return plain_generate(target, input_ids, seed=seed + r + 1, **sampling).stats

        mode = "sampled" if sampled else "greedy"
        record, plain_record = CostRecord(), CostRecord()
        for r in range(-1, repeats):  # turn -1 warms up (a compiled draft compiles there) and is not counted
            # the γs go up in one turn and down in the next, so that a drift within a turn does not tilt the
            # verify and draft lines
            for i, gamma in enumerate(gammas if r % 2 else gammas[::-1]):
                spec_costs = spec(gamma, r).costs
                # plain runs between every other γ's, so that a drift of the machine's speed falls on both sides
                plain_costs = plain(r).costs if i % 2 == 1 or len(gammas) == 1 else None
                if r >= 0:
                    record = record.merge(spec_costs)
                    plain_record = plain_record.merge(plain_costs) if plain_costs is not None else plain_record
            say(f"profile ({mode}, T = {temperature:g}): " + ("warmed up" if r < 0 else
                f"turn {r + 1}/{repeats} of γ {gammas[0]}–{gammas[-1]} and plain decoding"))
        key = profile_key(target, draft, sampled, input_ids.device)
        measured.append(CostProfile(key, record, plain_record, gammas, now(), max_new_tokens, repeats * len(gammas)))
    if len(measured) > 1:  # the forwards' lines from every mode's rounds (`CostProfile.forwards`)
        forwards, plain_forwards = measured[0].record, measured[0].plain
        for profile in measured[1:]:
            forwards, plain_forwards = forwards.merge(profile.record), plain_forwards.merge(profile.plain)
        for profile in measured:
            profile.forwards, profile.plain_forwards = forwards, plain_forwards
    for profile in measured:
        path = save(profile)
        say(f"profile ({profile.key['sampling']}) saved: {path}")
        out.append((profile, str(path)))
    return out


def summary_lines(profile: CostProfile, path: str) -> list[str]:
    """What a saved profile says, in one target step's units, for the CLI."""
    d = describe(profile)
    key = profile.key
    return [f"{key['sampling']} rounds, {key['dtype']} target on {key['cpu'] or key['cpu_kind']} "
            f"({key['threads']} threads), draft {key['draft']['spec']}: {path}",
            f"  plain step {d['step_ms']:.1f} ms; draft step c {d['c']:.3f} (+{d['draft_round']:.3f} a round); "
            f"verify 2 / 5 / 8 positions {d['verify_2']:.2f} / {d['verify_5']:.2f} / {d['verify_8']:.2f} steps; "
            f"outside forwards {d['other_round']:.3f} a round + {d['other_token']:.3f} a token (plain "
            f"{d['plain_other']:.3f})"]
