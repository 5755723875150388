"""Text output for the CLI: coloured tokens, statistics and tables, CSV/JSON, and the sweep figure."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hfspec import verify_cost
from hfspec.measure import predicted_speedup
from hfspec.stats import SpecStats, expected_tokens_per_pass, paper_speedup

COLOURS = {"accepted": "\033[32m", "resampled": "\033[33m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"


def coloured_text(pieces: list[tuple[str, str]], colour: bool) -> str:
    """Generated text, each token coloured by how it was produced (accepted draft / resampled / bonus)."""
    if not colour:
        return "".join(text for text, _ in pieces)
    return "".join(f"{COLOURS.get(kind, '')}{text}{RESET if COLOURS.get(kind) else ''}" for text, kind in pieces)


def legend(colour: bool) -> str:
    names = ("accepted", "resampled", "bonus")
    return "  ".join(f"{COLOURS[n]}{n}{RESET}" if colour else n for n in names)


STOP_WORDS = {"eos": "EOS", "max_tokens": "max new tokens", "stop_criteria": "stop string / criteria",
              "user": "stopped by the user", "mixed": "rows ended differently"}


def stats_lines(stats: SpecStats, baseline=None, measured_speedup: float | None = None,
                measurement=None) -> list[str]:
    """The numbers of one run, one per line. The speed-ups: predicted (the cost model, `hfspec.costmodel`, fitted
    to the timed measurement, else to the run), paper (the paper's formula with c time), ideal (the paper's formula
    with c bytes) and, with `baseline` (`hfspec.session.Baseline`) and `measured_speedup`
    (`RunResult.measured_speedup`), measured; `measurement` (`hfspec.measure.Measurement`) adds how rough the
    measured one is and how busy the machine was."""
    s = stats
    lines = [
        f"γ                        {s.gamma} (mean {s.mean_gamma:.2f})",
        f"target passes            {s.target_passes}",
        f"new tokens               {s.new_tokens}" + (f" (ended: {STOP_WORDS.get(s.stop_reason, s.stop_reason)})"
                                                       if s.stop_reason else ""),
        f"draft tokens             proposed {s.proposed}, checked {s.checked}, accepted {s.accepted}",
        f"acceptance rate α        {s.alpha:.3f}",
        f"tokens per target pass   {s.tokens_per_pass:.2f} (formula {s.expected_tokens_per_pass:.2f})",
        f"accepted by position     {_ratios(s.accepted_by_position, s.checked_by_position)}",
        f"accepted length hist     {s.accepted_length_hist}",
        *([f"tree leaves              {s.tree_leaves} scored, {s.tree_kept} siblings kept "
           f"({s.tree_kept / s.tree_leaves:.0%} of leaves, {s.tree_kept / max(1, s.target_passes):.2f} per pass)"]
          if s.tree_leaves else []),
        f"c (time)                 {s.c_time:.3f}  (mean draft forward / mean target forward, measured)",
        f"c (bytes)                {s.c_bytes:.3f}  ({s.draft_bytes / 1e6:.2f} MB / {s.target_bytes / 1e6:.2f} MB)",
        f"predicted speed-up       {predicted_speedup(s, measurement):.2f}× (cost model: {_source(s, measurement)})",
        f"paper speed-up           {s.paper_speedup:.2f}× (the paper's formula with c time: no verify width, no "
        f"overhead)",
        f"ideal speed-up           {s.ideal_speedup:.2f}× (the paper's formula with c bytes: weight-bound)",
        f"time                     {s.time_total:.2f} s: draft {s.time_draft:.2f}, target {s.time_target:.2f}, "
        f"other {s.time_other:.2f}",
        f"tokens per second        {s.tokens_per_second:.1f}",
    ]
    if baseline is not None and measured_speedup:
        plain = baseline.tokens_per_second
        median = f"median of {baseline.pairs} alternating pairs, " if baseline.pairs > 1 else ""
        lines.append(f"measured speed-up        {measured_speedup:.2f}×{_roughness(measurement)} ({median}"
                     f"{baseline.new_tokens} tokens, speculative {measured_speedup * plain:.1f} tok/s, plain "
                     f"decoding {plain:.1f} tok/s{_machine(measurement)})")
    lines += [f"advice                   {line}" for line in [verify_cost.advice(s, baseline)] if line]
    return lines


def _source(stats: SpecStats, measurement) -> str:
    if measurement is not None and measurement.speculative_runs:
        return "fitted to the timed speculative and plain runs"
    return stats.prediction.source if stats.target_passes else "nothing measured"


def _roughness(measurement) -> str:
    if measurement is None or not measurement.rough:
        return ""
    return f" (rough: {measurement.pairs} pair{'s' if measurement.pairs != 1 else ''})"


def _machine(measurement) -> str:
    if measurement is None:
        return ""
    load = f", load {measurement.load_avg:.2f}" if measurement.load_avg is not None else ""
    return f"; {measurement.threads} torch thread{'s' if measurement.threads != 1 else ''}{load}"


def _ratios(accepted: list[int], checked: list[int]) -> str:
    return " ".join(f"{a / c:.2f}" if c else "-" for a, c in zip(accepted, checked, strict=False))


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    out = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def write_csv(rows: list[dict], path: str | Path) -> None:
    """Rows of dicts as CSV (UTF-8), columns from the first row; no rows: an empty file. The one CSV writer
    (CLI and dashboard exports)."""
    rows = list(rows)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def dumps(data) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def plot_sweep(rows: list[dict], path: str | Path) -> None:
    """The plate's figure: tokens per pass against γ (measured points ± 1 s.d. over repeats, formula curve) and
    speed-up against γ (measured ± 1 s.d., the paper's formula with the measured c_time, the ideal with c_bytes)."""
    from hfspec.extras import require_extra

    require_extra("plot", "plot", "drawing the sweep's figure")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, draft in enumerate(dict.fromkeys(r["draft"] for r in rows)):
        pts = [r for r in rows if r["draft"] == draft and r["gamma"] != "auto"]
        if not pts:
            continue
        colour = f"C{i}"
        gs = [r["gamma"] for r in pts]
        checked = sum(r["checked"] for r in pts)
        alpha = sum(r["accepted"] for r in pts) / checked if checked else 0.0
        c_time = sum(r["c_time"] for r in pts) / len(pts)
        c_bytes = pts[0]["c_bytes"]
        curve = list(range(1, max(gs) + 1))
        ax1.errorbar(gs, [r["tokens_per_pass"] for r in pts], yerr=_errors(pts, "tokens_per_pass_sd"), fmt="o",
                     color=colour, capsize=3, label=f"{draft} measured")
        ax1.plot(curve, [expected_tokens_per_pass(alpha, g) for g in curve], "-", color=colour, alpha=0.6,
                 label=f"{draft} formula, α={alpha:.2f}")
        if c_time > 0:  # no paper speed-up where no draft forward was timed (prompt lookup)
            ax2.plot(curve, [paper_speedup(alpha, g, c_time) for g in curve], "-", color=colour, alpha=0.6,
                     label=f"{draft} paper speed-up, c_time={c_time:.2f}")
        ax2.plot(curve, [paper_speedup(alpha, g, c_bytes) for g in curve], ":", color=colour, alpha=0.5,
                 label=f"{draft} ideal speed-up, c_bytes={c_bytes:.2f}")
        ax2.errorbar(gs, [r["measured_speedup"] for r in pts], yerr=_errors(pts, "measured_speedup_sd"), fmt="s",
                     color=colour, capsize=3, label=f"{draft} measured speed-up (wall clock)")
    repeats = max((r.get("repeats", 1) for r in rows), default=1)
    note = f" (bars: ± 1 s.d. over {repeats} repeats)" if repeats > 1 else ""
    ax1.set(xlabel="γ (draft tokens per round)", ylabel="tokens per target pass", title="Tokens per target pass" + note)
    ax2.set(xlabel="γ (draft tokens per round)", ylabel="speed-up over plain decoding (×)", title="Speed-up" + note)
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # off the data
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _errors(rows: list[dict], key: str) -> list[float]:
    return [r.get(key) or 0.0 for r in rows]
