"""Do the front ends agree? The measured speed-up of the same settings from the dashboard, `hfspec run` and
`hfspec sweep` (issue 30: the same figure within their stated intervals).

    python benchmarks/bench_agreement.py --models micro,smollm2-offgrid --gamma 4 --temperatures 0,1 \\
        --max-new-tokens 128 --repeats 3

Each front end is called through its own code path, in this process, with the same settings (preset, target,
draft, γ, temperature, top_k 0, top_p 1, seed, prompt, exactly --max-new-tokens tokens):

* dashboard: `hfspec.session.Session.run` as the dashboard's worker calls it (one Session kept across repeats, a
  live callback, `before_measure`), its `RunResult.measurement`;
* run: `hfspec.cli.main(["run", …, "--ignore-eos", "--json"])`, the JSON summary's `measured_*` fields;
* sweep: `hfspec.cli.main(["sweep", …, "--gammas", γ, "--repeats", N, "--json", "--no-greedy-check"])`, the row's
  `measured_speedup`, `measured_speedup_low`/`_high`, `pairs`, `verdict`;
* dashboard-sweep (optional): `Session.sweep`, the dashboard's Sweep tab.

All of them time through `hfspec.measure.measure_speedup`; this script reads no clock. The front ends are
interleaved at the level of WHOLE measurements: repeat r calls each front end once, in an order rotated per repeat
(each call is itself a series of interleaved speculative/plain pairs). What each front end times is its own: the
run (CLI and dashboard alike) times 32-token segments of its text (`hfspec.session.MEASURE_*`: up to 9 pairs in
15 s), a sweep point times whole runs from the prompt (--sweep-repeats pairs after one warm-up pair).

Per (model, temperature): a row per repeat and front end (figure, interval and its coverage, pairs, verdict, what
was timed) and the agreement: for each pair of front ends, in how many repeats their intervals overlap, and
whether one's figure lay above the other's in every repeat (a systematic difference, not noise). "agree" means
every pair overlapped in every repeat. A markdown report to stdout and, with --out, OUT.md and OUT.json.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import statistics
import sys
from pathlib import Path

import common
from common import write_results

# model name -> (preset, target folder or None for the preset's, draft or None for the preset's)
MODELS = {
    "micro": ("micro-rtn4", None, None),
    "smollm2-offgrid": ("smollm2-135m-gptq4", "smollm2-offgrid", "gptq4-compiled"),
}
FRONT_ENDS = ("dashboard", "run", "sweep", "dashboard-sweep")


def main() -> None:
    p = common.parser(__doc__)
    p.set_defaults(models="micro,smollm2-offgrid", max_new_tokens=128, repeats=3, threads=None, seed=None)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--draft", help="draft spec for every model (default: micro-rtn4's rtn4-compiled for micro, "
                                   "gptq4-compiled for smollm2-offgrid)")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--front-ends", default="dashboard,run,sweep",
                   help=f"comma-separated, of: {', '.join(FRONT_ENDS)}")
    p.add_argument("--sweep-repeats", type=int, default=None,
                   help="pairs per sweep point (default: hfspec.session.MEASURE_PAIRS, as many as a run times)")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    p.add_argument("--verbose", action="store_true", help="show the front ends' progress lines (stderr)")
    args = p.parse_args()

    import torch

    from hfspec.session import MEASURE_PAIRS

    if args.threads:
        torch.set_num_threads(args.threads)
    fronts = [f.strip() for f in args.front_ends.split(",") if f.strip()]
    bad = [f for f in fronts if f not in FRONT_ENDS]
    if bad or len(fronts) < 2:
        p.error(f"--front-ends: got {args.front_ends!r}; allowed: two or more of {', '.join(FRONT_ENDS)}")
    sweep_pairs = args.sweep_repeats or MEASURE_PAIRS
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    cases = _cases(args)
    lines = [f"# Front-end agreement ({torch.get_num_threads()} torch threads; γ {args.gamma}, "
             f"{args.max_new_tokens} tokens, {args.repeats} repeats; sweep {sweep_pairs} pairs per point)", "",
             "Front ends interleaved per repeat at the level of whole measurements (order rotated each repeat).", ""]
    rows = []
    from hfspec.session import Session

    session = Session()  # the dashboard's: models kept between its runs
    for name, (preset, target, draft) in cases.items():
        for temperature in temperatures:
            settings = dict(preset=preset, target=target, draft=draft, gamma=args.gamma, temperature=temperature,
                            max_new_tokens=args.max_new_tokens, seed=args.seed)
            got = []
            for r in range(args.repeats):
                order = fronts[r % len(fronts):] + fronts[:r % len(fronts)]
                for front in order:
                    m = _measure(front, session, settings, sweep_pairs, args.verbose)
                    got.append(m | {"model": name, "temperature": temperature, "repeat": r, "front_end": front})
                    print(f"# {name} T={temperature:g} repeat {r + 1}/{args.repeats} {front}: {_cell(m)}",
                          file=sys.stderr, flush=True)
            rows += got
            lines += _table(name, temperature, got, fronts)
    print("\n".join(lines))
    write_results(args.out, lines, rows)


def _cases(args) -> dict:
    common.PAIRS["smollm2-offgrid"] = Path(args.smollm2_offgrid)
    out = {}
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        preset, target, draft = MODELS.get(name, ("micro-rtn4", name, None))
        if target is not None:
            folder = common.PAIRS.get(target, Path(target))
            if not (folder / "config.json").exists():
                print(f"# skipping {name}: {folder} not found")
                continue
            target = str(folder)
        out[name] = (preset, target, args.draft or draft)
    return out


# ------------------------------------------------------------------------------------------------ front ends
def _flags(s: dict) -> list[str]:
    """The settings as flags common to `run` and `sweep` (γ is `--gamma` for one, `--gammas` for the other)."""
    out = ["--preset", s["preset"], "--temperature", str(s["temperature"]), "--top-k", "0", "--top-p", "1",
           "--max-new-tokens", str(s["max_new_tokens"])]
    for key, flag in (("target", "--target"), ("draft", "--draft"), ("seed", "--seed")):
        if s[key] is not None:
            out += [flag, str(s[key])]
    return out


def _settings(s: dict):
    from hfspec.session import RunSettings

    overrides = {k: s[k] for k in ("target", "draft", "seed") if s[k] is not None}
    return RunSettings.from_preset(s["preset"], gamma=s["gamma"], temperature=s["temperature"], top_k=0,
                                   top_p=1.0, max_new_tokens=s["max_new_tokens"], ignore_eos=True,
                                   measure_baseline=True, **overrides)


def _cli(argv: list[str], verbose: bool):
    """`hfspec.cli.main(argv)` in this process: its stdout parsed as JSON."""
    from hfspec.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(sys.stderr if verbose else err):
        code = cli_main(argv)
    if code:
        raise SystemExit(f"hfspec {' '.join(argv)} exited {code}: {err.getvalue()[-2000:]}")
    text = out.getvalue()
    return json.loads(text[text.index("{"):])


def _measure(front: str, session, s: dict, sweep_pairs: int, verbose: bool) -> dict:
    """One whole measurement by one front end: figure, interval, coverage, pairs, verdict, what was timed."""
    say = (lambda m: print(f"  {m}", file=sys.stderr)) if verbose else None
    if front == "dashboard":
        result = session.run(_settings(s), on_live=lambda snapshot: None, progress=say, before_measure=lambda: None)
        m = result.measurement
        return _row(m.measured_speedup, m.low, m.high, m.coverage, m.pairs, m.verdict, m.segment,
                    m.speculative_tokens_per_second, m.plain_tokens_per_second)
    if front == "dashboard-sweep":
        got = session.sweep(_settings(s), [s["gamma"]], repeats=sweep_pairs, progress=say).points[0]
        return _row(got.measured_speedup, got.measured_speedup_low, got.measured_speedup_high,
                    got.interval_coverage, got.pairs, got.verdict, f"whole runs of {s['max_new_tokens']} tokens",
                    got.tokens_per_second, got.baseline_tokens_per_second)
    if front == "run":
        summary = _cli(["run", *_flags(s), "--gamma", str(s["gamma"]), "--ignore-eos", "--json"], verbose)["summary"]
        return _row(summary["measured_speedup"], summary["measured_speedup_low"], summary["measured_speedup_high"],
                    summary["measured_interval_coverage"], summary["measured_pairs"], summary["measured_verdict"],
                    summary["measured_segment"], summary["speculative_tokens_per_second_measured"],
                    summary["baseline_tokens_per_second"])
    got = _cli(["sweep", *_flags(s), "--gammas", str(s["gamma"]), "--repeats", str(sweep_pairs), "--json",
                "--no-greedy-check"], verbose)["rows"][0]
    return _row(got["measured_speedup"], got["measured_speedup_low"], got["measured_speedup_high"],
                got["interval_coverage"], got["pairs"], got["verdict"], f"whole runs of {s['max_new_tokens']} tokens",
                got["tokens_per_second"], got["baseline_tokens_per_second"])


def _row(figure, low, high, coverage, pairs, verdict, timed, tok_s, plain_tok_s) -> dict:
    return {"measured": figure, "low": low, "high": high, "coverage": coverage, "pairs": pairs, "verdict": verdict,
            "timed": timed, "tok_s": tok_s, "plain_tok_s": plain_tok_s}


# ------------------------------------------------------------------------------------------------ report
def _cell(m: dict) -> str:
    return (f"{m['measured']:.2f}× [{m['low']:.2f}–{m['high']:.2f}, {m['coverage']:.0%}] {m['pairs']} pairs "
            f"{m['verdict']}")


def overlap(a: dict, b: dict) -> bool:
    return a["low"] <= b["high"] and b["low"] <= a["high"]


def agreement(got: list[dict], fronts: list[str]) -> tuple[str, list[str]]:
    """("agree" | "disagree", a line per pair of front ends): overlaps per repeat, and a systematic side."""
    by = {(g["repeat"], g["front_end"]): g for g in got}
    repeats = sorted({g["repeat"] for g in got})
    lines, every = [], True
    for a, b in itertools.combinations(fronts, 2):
        pairs = [(by[r, a], by[r, b]) for r in repeats if (r, a) in by and (r, b) in by]
        ok = sum(overlap(x, y) for x, y in pairs)
        every &= ok == len(pairs)
        side = ""
        if len(pairs) > 1 and all(x["measured"] > y["measured"] for x, y in pairs):
            side = f"; {a} above {b} in every repeat"
        elif len(pairs) > 1 and all(x["measured"] < y["measured"] for x, y in pairs):
            side = f"; {a} below {b} in every repeat"
        ratio = statistics.median(x["measured"] / y["measured"] for x, y in pairs) if pairs else float("nan")
        lines.append(f"{a} vs {b}: intervals overlap in {ok}/{len(pairs)} repeats; median figure ratio "
                     f"{ratio:.3f}{side}")
    return ("agree" if every else "disagree"), lines


def _table(name: str, temperature: float, got: list[dict], fronts: list[str]) -> list[str]:
    lines = [f"## {name}, T = {temperature:g}", "",
             "| repeat | front end | measured | interval (coverage) | pairs | verdict | tok/s | plain tok/s | timed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in got:
        lines.append(f"| {g['repeat'] + 1} | {g['front_end']} | {g['measured']:.2f}× | {g['low']:.2f}–{g['high']:.2f} "
                     f"({g['coverage']:.0%}) | {g['pairs']} | {g['verdict']} | {g['tok_s']:.0f} | "
                     f"{g['plain_tok_s']:.0f} | {g['timed']} |")
    lines.append("")
    for front in fronts:
        mine = [g["measured"] for g in got if g["front_end"] == front]
        lines.append(f"* {front}: median of {len(mine)} figures {statistics.median(mine):.2f}× "
                     f"(range {min(mine):.2f}–{max(mine):.2f})")
    verdict, pairs = agreement(got, fronts)
    lines += [f"* {line}" for line in pairs]
    lines += [f"* **agreement: {verdict}**", ""]
    return lines


if __name__ == "__main__":
    main()
