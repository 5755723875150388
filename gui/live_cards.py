"""The Live tab's metric cards: what each shows and says in its tooltip, and the cards of the timed
measurement (the measured speed-up with its flag, timed rates, pairs, threads and load)."""

from __future__ import annotations

TIMED = "from the timed measurement after the run (speculative decoding without the live display, beside plain " \
        "decoding of the same tokens)"
CARDS = [  # key, caption, tooltip, widest expected value
    ("alpha", "acceptance α", "accepted / checked draft tokens (positions after EOS are not checked)", "0.000"),
    ("tpp", "tokens / pass", "new tokens per target forward, bonus included", "00.00"),
    ("expected", "formula E[tok/pass]", "(1−α^(γ+1))/(1−α) for this α, averaged over the γ each pass proposed",
     "00.00"),
    ("c_time", "cost c (time)", "mean draft forward time / mean target forward time, " + TIMED, "0.000"),
    ("predicted", "predicted speed-up", "the cost model's prediction from the timed run's measured step costs "
     "and tokens per pass, " + TIMED + "; — where none exists", "00.00×"),
    ("ideal", "ideal speed-up", "the paper's formula with c = draft bytes / target bytes: what a machine bound by "
     "weight reads would reach (not an upper bound: the measured speed-up can exceed it)", "00.00× · c 0.000"),
    ("measured", "measured speed-up", "the median per-pair ratio of speculative over plain tokens/s, " + TIMED +
     " (hfspec.measure, the CLI's rule); 'rough' under 3 pairs, 'unstable' when the pairs disagree, 'implausible' "
     "when its own passes cannot produce it", "00.00× implausible"),
    ("timed_rate", "measured tok/s: spec vs plain", "speculative decoding (timed, no display) vs plain decoding "
     "of the same tokens", "00000 vs 00000"),
    ("with", "measured with", "timed (speculative, plain) pairs and the interval of the median ratio, torch's CPU "
     "threads and the machine's 1-minute load average while measuring", "9 pairs 00.00–00.00× · 00 thr · load 00.0"),
    ("rate", "tokens / s live (with display)", "wall clock of the run you watched: it pays for the live "
     "display, so it is below the measured rate", "00000.0"),
    ("passes", "target passes", "", "00000"),
    ("ended", "ended by", "EOS, max tokens, a stop string, or the Stop button", "user (Stop)"),
]


def show_measured(metrics: dict, m) -> None:
    """The measured speed-up card, flagged rough / unstable / implausible with why, and the cards beside it
    (timed rates, pairs, threads, load); "—" without a measurement."""
    card = metrics["measured"]
    if m is None or m.speedup is None:
        card.set_value("—")
        card.set_flag("")
        metrics["timed_rate"].set_value("—")
        metrics["with"].set_value("—")
        return
    problem = m.unreliable
    why = {"rough": f"Rough: from {m.pairs or 'fewer than 3'} timed pair(s), fewer than 3; rerun for a figure "
                    "to rely on",
           "unstable": "Unstable: the timed pairs disagreed",
           "implausible": "Implausible: not a fact"}.get(problem, "")
    details = "\n".join(x for x in (m.why, m.disagreement and f"predicted vs measured: {m.disagreement}") if x)
    card.set_flag("\n".join(x for x in (why, details) if x) if problem else details)
    if not problem and details:  # a note (busy machine, a disagreement) without a mark on the value
        card.flag = ""
        card.setToolTip(f"{card.tip}\n\n{details}")
        card.restyle()
    card.set_value(f"{m.speedup:.2f}×{' ' + problem if problem else ''}")
    spec = f"{m.speculative_tps:.0f}" if m.speculative_tps else "—"
    plain = f"{m.plain_tps:.0f}" if m.plain_tps else "—"
    metrics["timed_rate"].set_value(f"{spec} vs {plain}")
    c = m.conditions
    interval = f" {m.low:.2f}–{m.high:.2f}×" if m.low and m.high and m.low != m.high else ""
    parts = [f"{m.pairs} pair{'s' if m.pairs != 1 else ''}{interval}"] if m.pairs is not None else []
    if c is not None:
        parts += [f"{c.threads} thr" if c.threads is not None else "? thr"]
        parts += [f"load {c.load_avg:.1f}"] if c.load_avg is not None else []
    metrics["with"].set_value(" · ".join(parts) or "—")
