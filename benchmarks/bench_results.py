"""The results table (docs/benchmarks.md, linked from the README's Results): plain `generate` against hfspec on targets that were never on the draft's grid.

    python benchmarks/bench_results.py                      # prints the table, writes results/<machine>-<date>-results.*
    python benchmarks/bench_results.py --docs               # also replaces the table in docs/benchmarks.md

Targets: `micro` (the embedded model, trained in fp32) and `smollm2-offgrid` (SmolLM2-135M moved off the rtn4
grid by benchmarks/offgrid.py); add `smollm2` to see the shipped, 4-bit-exact folder as a labelled best case.
Each row is one (target, dtype, T, draft, γ) against plain generate, timed by the ruler (common.against_plain:
interleaved rounds, a warm-up round not counted, the median of per-round ratios with its interval, outliers
re-measured, a stability verdict; with several prompts, outliers and intervals are judged within each prompt
and the figure is the geometric mean of the prompts' medians, their range shown in the verdict). α and tokens per pass are pooled over the kept rounds. "vs chain": a γ "auto"
row's tokens/s over its draft's fastest fixed-γ row, a tree row's over its draft's chain at the same γ, a row
with a "+hf" twin (γ written 5+hf: the target's passes through the HF forward instead of the lean target,
`hfspec.kernels.lean_target`) or a "+nonative" one (without `hfspec.kernels.native_step`, draft and lean target alike) over that twin, as the median of per-round ratios (both ran in every round: rows compared this way share the rounds' drift, which a
comparison of two "vs plain" columns does not cancel). Where a speculative decode's verify passes take the few-row
kernel (`hfspec.kernels.verify_linear`), plain decoding is timed through it too, one-row products included, in the
same rounds: "vs plain through the kernel" is speculation's own share of the speed-up; where they take the lean
target, plain decoding through the lean target (one token a pass, its native step where it runs) is timed too, and
"vs plain through the lean target" is that share for those passes. T = 1 is pure sampling (top-k 0, top-p 1). Drafts are built (and calibrated, compiled) before timing; their build is not in the figures.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import common
import torch

# a gamma's suffix -> the environment of its twin row, paired with the same row without it ("vs chain")
TWINS = {"+hf": {"HFSPEC_LEAN_TARGET": "off"},  # the target's passes through the HF forward, not the lean target
         "+nonative": {"HFSPEC_NATIVE_STEP": "off"}}  # no native C step: the draft compiled, the lean target eager
MARK = "<!-- results: filled by benchmarks/bench_results.py --docs -->"
LABELS = {"smollm2": "SmolLM2-135M as shipped (4-bit-exact for rtn4: a best case)",
          "smollm2-offgrid": "SmolLM2-135M off the grid", "micro": "micro (embedded, 1.8M)"}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(models="micro,smollm2-offgrid", repeats=5)
    p.add_argument("--runs", default="rtn4-compiled:4,gptq4-compiled:4,gptq4-compiled:5,gptq4-compiled:auto,"
                   "gptq4-compiled:auto:auto,int8:4,int8:auto,int8:auto:auto",
                   help="draft:gamma or draft:gamma:tree (tree auto: a token tree), comma-separated; gamma auto+priors: "
                        "γ auto without a saved cost profile; a gamma ending +hf (4+hf, auto+hf): the target's passes "
                        "through the HF forward (HFSPEC_LEAN_TARGET=off), +nonative: without the native C step, draft "
                        "and lean target (HFSPEC_NATIVE_STEP=off); each paired with the same row without it")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated; float32+prepack: fp32 with hfspec.kernels.fast_linear.prepack")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompt", action="append", default=None,
                   help="a prompt (repeat the flag for several: round r of a row uses prompt r mod their number, "
                   "every method of the round the same; default: 'Once upon a time')")
    p.add_argument("--docs", "--readme", dest="docs", action="store_true",
                   help="replace the results table in docs/benchmarks.md, which the README links (--readme: its old "
                        "name, from when the table was in the README)")
    p.add_argument("--from-json", default=None, help="render the rows of an earlier run's JSON instead of measuring")
    p.add_argument("--profile", action="store_true",
                   help="measure this machine's cost profile of each draft that runs with γ auto before timing "
                        "(hfspec profile; saved where seeded γ auto finds it); write draft:auto+priors for a row "
                        "that ignores it")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.prompt = args.prompt or ["Once upon a time"]
    day = datetime.date.today().isoformat()
    header = (f"{common.machine_name()}, {day}, {args.threads} threads, {args.max_new_tokens} new tokens, "
              f"{_prompts(args.prompt)}, median of {args.repeats} interleaved rounds per row (load average at start "
              f"{os.getloadavg()[0]:.2f}); `python benchmarks/bench_results.py --docs` regenerates it.")
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        if isinstance(data, list):  # rows alone: the header is the first line of the .md beside it
            data = {"rows": data, "header": Path(args.from_json).with_suffix(".md").read_text().splitlines()[0]}
        rows, header = data["rows"], data["header"]
    else:
        rows = measure(args)
    lines = render(header, rows)
    print("\n".join(lines))
    out = Path(__file__).parent / "results" / f"{common.machine_name()}-{day}-results"
    if not args.from_json:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        out.with_suffix(".json").write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")
    if args.docs:
        page = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
        text = page.read_text()
        start = text.index(MARK) + len(MARK)
        end = text.index("\n## ", start)
        text = text[:start] + "\n\n" + "\n".join(lines) + "\n" + text[end:]
        page.write_text(re.sub(r"\n{3,}", "\n\n", text))


def render(header: str, rows: list[dict]) -> list[str]:
    """The table: one row per measurement, a short verdict per row and each distinct warning once below."""
    kernel = any("vs_plain_kernel" in r for r in rows)  # a column for speculation's own share where it was timed
    lean = any("vs_plain_lean" in r for r in rows)
    lines = [header, "", "| target | dtype | T | draft | γ | α | tokens / pass | plain tok/s | hfspec tok/s | vs plain | "
             "interval | " + ("vs plain through the kernel | " if kernel else "")
             + ("vs plain through the lean target | " if lean else "") + "vs chain | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if kernel else "") + ("---|" if lean else "")
             + "---|"]
    notes: list[str] = []
    for r in rows:
        spread = (f"; prompts {min(r['vs_plain_by_prompt']):.2f}–{max(r['vs_plain_by_prompt']):.2f}×"
                  if r.get("vs_plain_by_prompt") else "")
        verdict = r["flags"] or f"{'stable' if r['stable'] else 'unstable'} ({r['pairs']} pairs{spread})"
        if r.get("warnings") and r["warnings"] not in notes:
            notes.append(r["warnings"])
        if r.get("warnings"):
            verdict += f" [{notes.index(r['warnings']) + 1}]"
        lines.append(f"| {LABELS.get(r['target'], r['target'])} | {r['dtype']} | {r['temperature']:g} | {r['draft']} | "
                     f"{r['gamma']} | {r['alpha']:.3f} | {r['tokens_per_pass']:.2f} | {r['plain_tok_s']:.1f} | "
                     f"{r['tok_s']:.1f} | **{r['vs_plain']:.2f}×** | {common.interval_cell(r)} | "
                     + (f"{_kernel_cell(r)} | " if kernel else "") + (f"{_kernel_cell(r, 'lean')} | " if lean else "")
                     + f"{_chain_cell(r)} | {verdict} |")
    return lines + [""] + [f"[{i + 1}] {note}" for i, note in enumerate(notes)]


def _kernel_cell(r: dict, name: str = "kernel") -> str:
    """"1.52× (1.45–1.60), plain 41.0 tok/s" where plain decoding was also timed through the few-row kernel (name
    "lean": through the lean target, one token a pass), else "—"."""
    if f"vs_plain_{name}" not in r:
        return "—"
    return (f"{r[f'vs_plain_{name}']:.2f}× ({common.interval_cell(r, f'vs_plain_{name}')}), plain "
            f"{r[f'plain_{name}_tok_s']:.1f} tok/s")


def _chain_cell(r: dict) -> str:
    """"0.97× of γ 4 (0.90–1.05)" for a row paired with a chain (`chain_pair`), else "—"."""
    if "vs_chain" not in r:
        return "—"
    return f"{r['vs_chain']:.2f}× of {r['vs_chain_of']} ({common.interval_cell(r, 'vs_chain')})"


def measure(args) -> list[dict]:
    import hfspec

    runs = [_run(r) for r in args.runs.split(",")]
    rows = []
    for name, folder in common.model_folders(args).items():
        for dtype in args.dtypes.split(","):
            target, tok = common.load(folder, dtype)  # float32+prepack: prepacked (both sides)
            ids = [common.prompt_ids(tok, text) for text in args.prompt]
            drafts = {spec: hfspec.make_draft(target, spec) for spec in dict.fromkeys(s for s, _, _ in runs)}
            temperatures = [float(t) for t in args.temperatures.split(",")]
            if args.profile:  # this machine's cost profile of each draft γ "auto" runs with (not timed here)
                _profile(target, drafts, runs, ids[0], temperatures, args.max_new_tokens)
            for temperature in temperatures:
                keyed = {_key(spec, gamma, tree): (drafts[spec], "auto" if gamma.startswith("auto")
                                                   else int(gamma.split("+")[0]), _options(gamma, tree))
                         for spec, gamma, tree in runs}
                result = common.against_plain(target, ids, keyed, temperature, args.max_new_tokens, args.repeats,
                                              args.seed)
                for key, r in result.items():
                    spec, gamma, tree = next(run for run in runs if _key(*run) == key)
                    row = {"target": name, "dtype": dtype, "temperature": temperature, "draft": spec,
                           "gamma": gamma if tree is None else f"tree {tree}", **chain_pair(result, runs, spec, gamma,
                                                                                           tree), **r}
                    rows.append(row)
                    print(render("", [row])[4], flush=True)  # the row itself
    return rows


def _options(gamma: str, tree) -> dict:
    """hfspec.generate's keywords for a run: its tree; "auto+priors": γ auto priced from the priors alone (no saved
    cost profile), beside "auto", which takes this machine's profile where `--profile` measured one; "+hf" at the
    end: the target's passes through the HF forward, not the lean target (`hfspec.kernels.lean_target`); "+nonative":
    without the native C step (`hfspec.kernels.native_step`) in the draft and the lean target."""
    env = {"HFSPEC_COST_PROFILE": "off"} if "+priors" in gamma else {}
    for suffix, twin in TWINS.items():
        env |= twin if gamma.endswith(suffix) else {}
    return ({} if tree is None else {"tree": tree}) | ({"env": env} if env else {})


def _profile(target, drafts: dict, runs: list, ids, temperatures: list, tokens: int) -> None:
    """`hfspec profile` of each draft a γ "auto" row runs with, greedy and sampled rounds as the rows' temperatures
    ask (measured together: their forwards' lines pool both)."""
    from hfspec.measure.profile import measure_profile

    modes = sorted({t > 0 for t in temperatures})
    for spec in dict.fromkeys(s for s, g, _ in runs if g == "auto"):
        for profile, path in measure_profile(target, drafts[spec], ids, temperatures=[1.0 if m else 0.0 for m in modes],
                                             max_new_tokens=min(tokens, 64), progress=print):
            print(f"profile of {spec} ({profile.key['sampling']}): {path}", flush=True)


def chain_pair(result: dict, runs: list, spec: str, gamma: str, tree) -> dict:
    """For a γ "auto" chain row: its tokens/s over the same draft's fastest fixed-γ chain, round by round
    (`common.paired`); for a tree row, over the same draft's chain at the same γ (else the fastest fixed γ).
    {} for a fixed-γ chain row or where there is nothing to pair with."""
    hf = next((suffix for suffix in TWINS if gamma.endswith(suffix)), "")
    for suffix in TWINS if not hf else ():  # a row over its twin (the lean target's over the HF forward, ...)
        twin = _key(spec, gamma + suffix, tree)
        if twin in result:
            pair = common.paired(result[_key(spec, gamma, tree)], result[twin])
            return {"vs_chain": pair.median, "vs_chain_low": pair.low, "vs_chain_high": pair.high,
                    "vs_chain_of": "γ " + twin.split("@", 1)[1].replace("@", " ")}
    fixed = [g for s, g, t in runs if s == spec and t is None and not g.startswith("auto")
             and next((x for x in TWINS if g.endswith(x)), "") == hf]
    if tree is None and not gamma.startswith("auto"):
        return {}
    chain = _key(spec, gamma, None) if tree is not None and _key(spec, gamma, None) in result else None
    if chain is None and fixed:
        chain = _key(spec, max(fixed, key=lambda g: result[_key(spec, g, None)]["tok_s"]), None)
    if chain is None:
        return {}
    pair = common.paired(result[_key(spec, gamma, tree)], result[chain])
    return {"vs_chain": pair.median, "vs_chain_low": pair.low, "vs_chain_high": pair.high,
            "vs_chain_of": "γ " + chain.split("@")[1]}


def _prompts(texts: list[str]) -> str:
    """The header's words for the prompts: one, or several taken in turn by the rounds."""
    if len(texts) == 1:
        return f"prompt {texts[0]!r}"
    return f"{len(texts)} prompts in turn by round ({', '.join(repr(t) for t in texts)})"


def _key(spec: str, gamma: str, tree) -> str:
    """A run's key in the ruler's timings: draft@gamma, then @tree-<tree> for a tree run."""
    return f"{spec}@{gamma}" + ("" if tree is None else f"@tree-{tree}")


def _run(text: str) -> tuple[str, str, str | int | None]:
    """"draft:gamma" or "draft:gamma:tree" (tree "auto" or 2..8) → (draft, gamma, tree or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--runs: cannot read {text!r}; write draft:gamma or draft:gamma:tree, e.g. gptq4:4, "
                         "gptq4-compiled:auto:auto")
    tree = None if len(parts) == 2 else (parts[2] if parts[2] == "auto" else int(parts[2]))
    return parts[0], parts[1], tree


if __name__ == "__main__":
    main()
