"""Text output for the CLI: coloured tokens, statistics and tables, CSV/JSON, and the sweep figure."""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path

from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, paper_speedup
from hfspec.extras import require_extra
from hfspec.measure import verify_cost
from hfspec.measure.plausible import ideal_note
from hfspec.measure.ruler import ROUGH_BELOW, predicted_speedup

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
    """The numbers of one run, one per line. The speed-ups: predicted (the cost model, `hfspec.decoding.costmodel`, fitted
    to the timed measurement, else to the run), paper (the paper's formula with c time), ideal (the paper's formula
    with c bytes) and, with `baseline` (`hfspec.session.Baseline`) and `measured_speedup`
    (`RunResult.measured_speedup`), measured; `measurement` (`hfspec.measure.Measurement`) adds how rough the
    measured one is and how busy the machine was."""
    s = stats
    lines = [
        f"γ                        {s.gamma} (mean {s.mean_gamma:.2f})"
        + (f"; priced by this machine's cost profile {s.cost_profile}" if s.cost_profile else ""),
        f"target passes            {s.target_passes}" + (f" ({s.target_path})" if s.target_path else ""),
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
        *([f"tree rounds              {s.tree_rounds} grown as trees, {s.chain_rounds} run as the chain "
           f"(tree \"auto\" falls back where a tree does not pay)"] if s.chain_rounds else []),
        f"c (time)                 {s.c_time:.3f}  (mean draft forward / mean target forward, measured)",
        f"c (bytes)                {s.c_bytes:.3f}  ({s.draft_bytes / 1e6:.2f} MB / {s.target_bytes / 1e6:.2f} MB)",
        (f"predicted speed-up       {predicted_speedup(s, measurement):.2f}× (cost model: {_source(s, measurement)})"
         if predicted_speedup(s, measurement) else
         "predicted speed-up       — (no draft forward to time: the cost model has no step costs to price)"),
        f"paper speed-up           {s.paper_speedup:.2f}× (the paper's formula with c time: no verify width, no "
        f"overhead)",
        f"ideal speed-up           {s.ideal_speedup:.2f}× (the paper's formula with c bytes: weight-bound)",
        f"time                     {s.time_total:.2f} s: draft {s.time_draft:.2f}, target {s.time_target:.2f}, "
        f"other {s.time_other:.2f}",
        f"tokens per second        {s.tokens_per_second:.1f}",
    ]
    if measurement is not None and measured_speedup:
        lines += measurement_lines(measurement, s)
    elif baseline is not None and measured_speedup:  # a measurement built by hand, without the ruler's record
        lines.append(f"measured speed-up        {measured_speedup:.2f}× ({baseline.new_tokens} tokens)")
    lines += [f"advice                   {line}" for line in [verify_cost.advice(s, baseline)] if line]
    return lines


def _source(stats: SpecStats, measurement) -> str:
    if measurement is not None and measurement.speculative_runs:
        return "fitted to the timed speculative and plain runs"
    return stats.prediction.source if stats.target_passes else "nothing measured"


def measurement_lines(m, stats: SpecStats | None = None) -> list[str]:
    """The measured speed-up as the ruler (`hfspec.measure`) gives it: the figure with its interval, how it was
    timed, the verdict, and a line for each warning, flag, disagreement with the prediction and ideal note."""
    x = m.measured_speedup
    interval = (f" [{m.low:.2f}–{m.high:.2f}×, {m.coverage:.0%} interval]"
                if m.low is not None and m.high is not None and m.pairs > 1 else "")
    how = (f"median of {m.pairs} alternating pair{'s' if m.pairs != 1 else ''}"
           + (f" of {m.segment}" if m.segment else f" of {m.new_tokens} tokens")
           + (f", {m.outliers} outlier{'s' if m.outliers != 1 else ''} dropped and {m.remeasured} re-measured"
              if m.outliers else ""))
    load = f", load {m.load_avg:.2f}" if m.load_avg is not None else ""
    cores = f" on {m.cores} cores" if m.cores else ""
    word = "" if m.verdict == "stable" else f" ({m.verdict.upper()}, not a fact)" if m.flags else f" ({m.verdict})"
    lines = [f"measured speed-up        {x:.2f}×{interval}{word} ({how}; speculative "
             f"{m.speculative_tokens_per_second:.1f} tok/s, plain decoding {m.plain_tokens_per_second:.1f} tok/s; "
             f"{m.threads} torch thread{'s' if m.threads != 1 else ''}{cores}{load})"]
    lines += [f"  ! {text}" for text in m.flags + m.warnings]
    if m.disagreement:
        lines.append(f"  predicted vs measured: {m.disagreement}")
    timed = functools.reduce(SpecStats.merge, m.speculative_runs) if m.speculative_runs else stats
    note = ideal_note(timed, x) if timed is not None else ""
    if note:
        lines.append(f"  ideal: {note}")
    return lines


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


def measured_cell(row: dict) -> str:
    """A table's measured speed-up: "1.32× [1.25–1.40]" and the verdict when it is not stable."""
    x = row.get("measured_speedup")
    if not x:
        return "-"
    lo, hi = row.get("measured_speedup_low"), row.get("measured_speedup_high")
    text = f"{x:.2f}×" + (f" [{lo:.2f}–{hi:.2f}]" if lo is not None and hi is not None and lo != hi else "")
    why = row_problem(row)
    return text + (f" {why.upper() if why == 'implausible' else why}" if why else "")


def row_notes(rows: list[dict]) -> list[str]:
    """One line per row with flags, warnings or a disagreement between predicted and measured."""
    out = []
    for r in rows:
        where = f"{r.get('draft')} γ {r.get('gamma')}"
        for key in ("flags", "warnings", "disagreement"):
            for text in filter(None, str(r.get(key) or "").split("; ")) if key != "disagreement" else \
                    [r.get(key)] if r.get(key) else []:
                out.append(f"{where}: {text}")
    return out


def row_problem(row: dict) -> str:
    """Why a sweep/compare row's measured speed-up is not to be relied on ("" when it is): "implausible",
    "unstable" or "rough" (fewer than `hfspec.measure.ROUGH_BELOW` pairs), by the ruler's columns (rows written
    before them: by their repeats)."""
    if row.get("flags"):
        return "implausible"
    pairs = row.get("pairs") if row.get("pairs") is not None else row.get("repeats", 1)
    if (pairs or 0) < ROUGH_BELOW:
        return "rough"
    return "unstable" if row.get("stable") is False or row.get("verdict") == "unstable" else ""


WHY = {"rough": "rough: fewer than 3 timed pairs", "unstable": "unstable: pairs disagreed (see warnings)",
       "implausible": "implausible: above what its passes allow"}


def speed_axis(plausible: list[float]) -> tuple[float, float]:
    """A speed-up axis set by the plausible values (predicted, formulas, reliable measurements and their bounds):
    0 to 1.3 × their largest (at least 1.5×); an implausible point beyond it is drawn at the edge, not stretched
    to."""
    top = max([1.5, *(v for v in plausible if v is not None and math.isfinite(v))]) * 1.3
    return 0.0, top


def plot_sweep(rows: list[dict], path: str | Path) -> dict:
    """The plate's figure: tokens per pass against γ (measured points ± 1 s.d. over pairs, formula curve) and
    speed-up against γ: measured (median with its interval as bars; hollow where rough, unstable or implausible,
    the legend says which), the predicted speed-up (the cost model, the figure the CSV and CLI give), the paper's
    formula with c_time and with c_bytes (ideal). The speed-up axis is set by the plausible values; a point
    beyond it is drawn at the edge with its value written. Returns what it drew: {"ylim", "unreliable":
    [(draft, γ, why)], "off_scale": [(draft, γ, value)]} (for tests)."""
    require_extra("plot", "plot", "drawing the sweep's figure")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    drawn = {"unreliable": [], "off_scale": []}
    plausible, why_seen = [], set()
    for r in rows:
        if r.get("gamma") == "auto":
            continue
        plausible += [r.get("predicted_speedup"), r.get("paper_speedup"), r.get("ideal_speedup")]
        if not row_problem(r):
            plausible += [r.get("measured_speedup_high") or r.get("measured_speedup")]
        elif r.get("speedup_bound"):
            plausible.append(r["speedup_bound"])
    low, top = speed_axis([v for v in plausible if v])
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
        if any(r.get("predicted_speedup") for r in pts):
            ax2.plot(gs, [r.get("predicted_speedup") or math.nan for r in pts], "-", marker="x", color=colour,
                     label=f"{draft} predicted (cost model, as in the CSV)")
        if c_time > 0:  # no paper speed-up where no draft forward was timed (prompt lookup)
            ax2.plot(curve, [paper_speedup(alpha, g, c_time) for g in curve], "--", color=colour, alpha=0.5,
                     label=f"{draft} paper formula, c_time={c_time:.2f}")
        ax2.plot(curve, [paper_speedup(alpha, g, c_bytes) for g in curve], ":", color=colour, alpha=0.5,
                 label=f"{draft} paper formula with c_bytes={c_bytes:.2f} (ideal)")
        first = True
        for r in pts:
            value = r["measured_speedup"]
            why = row_problem(r)
            lo, hi = r.get("measured_speedup_low"), r.get("measured_speedup_high")
            shown = min(value, top * 0.97)
            if value > top * 0.97:
                drawn["off_scale"].append((draft, r["gamma"], value))
                ax2.annotate(f"{value:.1f}× ↑", (r["gamma"], shown), textcoords="offset points", xytext=(4, -10),
                             fontsize=7, color=colour)
            if why:
                drawn["unreliable"].append((draft, r["gamma"], why))
                why_seen.add(why)
            if lo is not None and hi is not None:
                err = [[max(0.0, shown - min(lo, top))], [max(0.0, min(hi, top) - shown)]]
            else:
                err = [[r.get("measured_speedup_sd") or 0.0], [r.get("measured_speedup_sd") or 0.0]]
            ax2.errorbar([r["gamma"]], [shown], yerr=err, fmt="s", color=colour, capsize=3,
                         markerfacecolor="white" if why else colour, markeredgecolor=colour,
                         label=f"{draft} measured speed-up (median, interval)" if first else None)
            first = False
    pairs = max((r.get("pairs") or r.get("repeats", 1) for r in rows), default=1)
    note = f" (bars: ± 1 s.d. over {pairs} pairs)" if pairs > 1 else ""
    ax1.set(xlabel="γ (draft tokens per round)", ylabel="tokens per target pass", title="Tokens per target pass" + note)
    ax2.set(xlabel="γ (draft tokens per round)", ylabel="speed-up over plain decoding (×)",
            title="Speed-up (bars: the median's interval over pairs)")
    ax2.set_ylim(low, top)
    ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
    handles = [Line2D([], [], marker="s", ls="", markerfacecolor="white", markeredgecolor="black",
                      label="hollow: " + "; ".join(WHY[w] for w in sorted(why_seen)))] if why_seen else []
    if drawn["off_scale"]:
        handles.append(Line2D([], [], ls="", marker="$↑$", color="black",
                              label="off the axis (value written; axis set by the plausible values)"))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        extra = handles if ax is ax2 else []
        ax.legend(handles=ax.get_legend_handles_labels()[0] + extra, fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), ncol=2)  # off the data
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    drawn["ylim"] = (low, top)
    return drawn


def _errors(rows: list[dict], key: str) -> list[float]:
    return [r.get(key) or 0.0 for r in rows]
