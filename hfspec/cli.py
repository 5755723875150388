"""`hfspec` command line: run, sweep, compare, bench, audit, sensitivity, presets, gui, export-hub, export-draft.

Verbs only: parse, call the API, print. `hfspec gui` imports the dashboard (Qt, an optional extra) only when run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from hfspec import report
from hfspec.audit.command import run_command
from hfspec.audit.exactness import exactness_note
from hfspec.drafts import parse_draft_spec
from hfspec.drafts.registry import allowed
from hfspec.drafts.sensitivity import check_arguments, sensitivity
from hfspec.errors import HfspecError
from hfspec.extras import require_extra
from hfspec.hub_export import export_hub
from hfspec.io.export_draft import export_draft_cli
from hfspec.io.loading import load_model
from hfspec.io.presets import DEFAULT_PRESET, list_presets
from hfspec.measure.benchmark import compare_methods
from hfspec.measure.sweep import parse_gammas, speculative_options, sweep
from hfspec.session import RunSettings, Session
from hfspec.settings import load_preset


def _gamma(text: str):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma: got {text!r}; allowed: an integer 1..64 or auto") from None


def _coupling(text: str) -> str:
    if text in ("rejection", "gumbel"):
        return text
    raise argparse.ArgumentTypeError(f"coupling: got {text!r}; allowed: rejection (the default) or gumbel "
                                     "(draft-invariant: the text for a seed is the same whatever the draft and gamma)")


def _coupling_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coupling", type=_coupling, metavar="{rejection,gumbel}",
                   help="how draft and target are coupled when sampling: rejection (default; most accepted) or "
                        "gumbel (draft-invariant: Gumbel-max on noise keyed by seed and position, so the text for a "
                        "seed is the same whatever the draft and gamma; fewer accepted)")


def _draft_specs() -> str:
    """The allowed draft specs, from the registry of draft kinds (escaped for argparse's %-formatting)."""
    return allowed().replace("%", "%%")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset name or .toml path (default {DEFAULT_PRESET})")
    p.add_argument("--target", help="target: model folder, hub id or .gguf file (overrides the preset)")
    p.add_argument("--draft", help=f"draft: {_draft_specs()}")
    p.add_argument("--temperature", type=float, help="0 is greedy")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--prompt")
    p.add_argument("--dtype", help="float32 | bfloat16 | float16 | auto (default: auto, the dtype the checkpoint "
                   "was saved in)")
    p.add_argument("--device", help="cpu | cuda | cuda:N | mps | auto")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfspec", description="Exact speculative decoding for HF causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate once; tokens coloured by origin; statistics")
    _common(run)
    run.add_argument("--gamma", type=_gamma)
    run.add_argument("--early-exit", action="store_true",
                     help="the draft stops a round early when another token does not pay (γ is the cap)")
    run.add_argument("--tree", type=_tree_arg,
                     help="auto: a token tree sized by the cost model; 2..8: candidates per unsure draft position "
                          "(sibling leaves); 0: the plain chain")
    _coupling_option(run)
    run.add_argument("--no-baseline", action="store_true", help="skip the plain run (measured speed-up)")
    run.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens")
    run.add_argument("--json", action="store_true", help="print statistics as JSON")
    run.add_argument("--no-color", action="store_true")

    sweep = sub.add_parser("sweep", help="α, tokens per pass and speed-up for each γ (the plate's figure)")
    _common(sweep)
    sweep.add_argument("--gammas", default="1-8", help="e.g. 1-8, 1,2,4, 1-6,auto")
    sweep.add_argument("--drafts", help=f"comma-separated draft specs (default: the preset's draft); each one of: "
                                         f"{_draft_specs()}")
    sweep.add_argument("--repeats", type=int, default=1, help="seeded runs pooled per point")
    sweep.add_argument("--json", action="store_true")
    sweep.add_argument("--csv", metavar="FILE")
    sweep.add_argument("--plot", metavar="FILE.png")
    sweep.add_argument("--no-greedy-check", action="store_true", help="skip the temperature-0 identity check")
    _coupling_option(sweep)

    compare = sub.add_parser("compare", help="several drafts on the same prompt and settings")
    _common(compare)
    compare.add_argument("--gamma", type=_gamma)
    compare.add_argument("--drafts", required=True, help=f"comma-separated draft specs, each one of: {_draft_specs()}")
    compare.add_argument("--repeats", type=int, default=1)
    compare.add_argument("--json", action="store_true")
    compare.add_argument("--csv", metavar="FILE")
    _coupling_option(compare)

    bench = sub.add_parser("bench", help="plain generate vs HF assisted vs hfspec, tokens/s side by side")
    _common(bench)
    bench.add_argument("--gamma", type=int)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--json", action="store_true")

    audit = sub.add_parser("audit", help="exactness audit of a target and draft on this machine (exit 0: all pass)")
    _audit_arguments(audit)

    hub = sub.add_parser("export-hub", help="write a transformers custom_generate folder that runs hfspec")
    hub.add_argument("out", metavar="OUT", help="folder to write (new or empty)")
    hub.add_argument("--draft", default="rtn4", help=f"the folder's default draft: {_draft_specs()}")
    hub.add_argument("--gamma", type=_gamma, default=4, help="the folder's default gamma (1..64 or auto)")
    hub.add_argument("--overwrite", action="store_true", help="replace OUT if it is not empty")

    export = sub.add_parser("export-draft", help="save an RTN draft as a compressed-tensors checkpoint for serving")
    export.add_argument("out", metavar="OUT", help="folder to write (new or empty)")
    export.add_argument("--target", required=True, help="target: model folder or hub id")
    export.add_argument("--draft", default="rtn4", help="rtn4 or rtn8, optionally -g32/-g64/-g128 (default rtn4)")
    export.add_argument("--gamma", type=int, help="num_speculative_tokens of the printed command (default 4)")
    export.add_argument("--dtype", help="float32 | bfloat16 | float16 | auto (default float32)")
    export.add_argument("--overwrite", action="store_true", help="replace OUT if it is not empty")
    export.add_argument("--no-check", action="store_true", help="skip loading OUT back to compare logits")

    sens = sub.add_parser("sensitivity", help="which matrices cost a quantised draft its acceptance (to choose bits)")
    sens.add_argument("--target", help="model folder, hub id or preset name (default: the default preset's target)")
    sens.add_argument("--bits", type=int, default=4, help="bits of the draft's codes, 2..8 (default 4)")
    sens.add_argument("--group", type=int, default=32, help="group size along the input dimension (default 32)")
    sens.add_argument("--method", default="rtn", help="rtn (round to nearest) or gptq (calibrated); default rtn")
    sens.add_argument("--by", default="layer", help="layer (attention / MLP per layer, head) or matrix")
    sens.add_argument("--tokens", type=int, default=512, help="positions of the target's own text (default 512)")
    sens.add_argument("--seed", type=int, default=0, help="seed of the self-sampled text (default 0)")
    sens.add_argument("--dtype", help="float32 | bfloat16 | float16 | auto")
    sens.add_argument("--json", metavar="FILE", help="also write the report as JSON")

    sub.add_parser("presets", help="list the presets")
    gui = sub.add_parser("gui", help="open the dashboard")
    gui.add_argument("--preset", help="start with this preset")
    gui.add_argument("--settings", metavar="FILE.ini", help="settings file (default: the user's)")
    gui.add_argument("--run", action="store_true", help="start a run at once")
    gui.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own, as `hfspec run` uses)")
    return parser


def _audit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"fills in what the flags leave out (default {DEFAULT_PRESET})")
    p.add_argument("--target", help="target: model folder, hub id or .gguf file")
    p.add_argument("--draft", help=f"draft: {_draft_specs()}")
    p.add_argument("--dtype", help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--device", help="cpu | cuda | cuda:N | mps | auto")
    p.add_argument("--prompts", nargs="+", metavar="TEXT", help="prompts for the greedy check (default: four built in)")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    p.add_argument("--samples", type=int, help="samples per chi-square test (default: the fewest of 500, 1000, "
                   "2000, 4000 at which the control is predicted to fail with probability 0.99)")
    p.add_argument("--temperature", type=float, help="your sampling settings, tested beside T=1")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--gamma", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--bitwise-verify", action="store_true",
                   help="audit with hfspec.audit.exactness.use_bitwise_verify (bf16 greedy bit for bit on CPUs that allow it)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _check_args(args) -> None:
    """Counts, draft lists and output files, checked before anything loads or runs."""
    repeats = getattr(args, "repeats", None)
    if repeats is not None and repeats < 1:
        raise HfspecError(f"repeats: got {repeats}; allowed: an integer >= 1")
    drafts = getattr(args, "drafts", None)
    if drafts is not None and not [d for d in drafts.split(",") if d.strip()]:
        raise HfspecError(f"drafts: got {drafts!r}; allowed: comma-separated draft specs, e.g. rtn4,rtn3-g64")
    for flag in ("csv", "plot"):
        if getattr(args, flag, None):
            _check_writable(getattr(args, flag), f"--{flag}")
    if getattr(args, "plot", None):
        _check_plot_format(args.plot)


def _check_writable(path: str, field: str) -> None:
    """The output file can be created or overwritten (checked before the work whose result it holds)."""
    target = Path(path).expanduser()
    folder = target.parent
    if target.is_dir():
        raise HfspecError(f"{field}: {path!r} is a folder; allowed: a file path in a writable folder")
    if not folder.is_dir():
        raise HfspecError(f"{field}: folder {str(folder)!r} does not exist; allowed: a file path in a writable folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise HfspecError(f"{field}: {path!r} is not writable; allowed: a file path in a writable folder")


def _check_plot_format(path: str) -> None:
    require_extra("plot", "--plot", "drawing the sweep's figure")
    from matplotlib.figure import Figure

    kinds = Figure().canvas.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in kinds:
        raise HfspecError(f"--plot: got {path!r}; allowed: a file ending in .{', .'.join(sorted(kinds))}")


def _tree_arg(text: str):
    """--tree: "auto" or an integer (checked with the other settings)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: auto or an integer from 0 to 8") from None


def _settings(args, **extra):
    _check_args(args)

    overrides = {k: v for k, v in {
        "target": args.target, "draft": args.draft, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "seed": args.seed, "prompt": args.prompt,
        "gamma": getattr(args, "gamma", None), "early_exit": getattr(args, "early_exit", None) or None,
        "tree": getattr(args, "tree", None), "coupling": getattr(args, "coupling", None),
    }.items() if v is not None}
    settings = replace(RunSettings.from_preset(args.preset, **overrides), **extra).validated()
    for spec in (getattr(args, "drafts", None) or settings.draft).split(","):
        if spec.strip():
            parsed = parse_draft_spec(spec.strip())  # a bad spec fails here, before any model loads
            if parsed.kind == "bnb":  # and so does a missing optional extra
                require_extra("bnb", "draft", f"{parsed.label} (bitsandbytes layers; without it: rtn2..rtn8[-gN], "
                              "or a model folder / hub id)")
    return settings


def _session(args):
    return Session(dtype=args.dtype, device=args.device)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def cmd_run(args) -> int:
    # --ignore-eos can only turn it on: without the flag the preset's own ignore_eos stands
    settings = _settings(args, measure_baseline=not args.no_baseline, **({"ignore_eos": True} if args.ignore_eos else {}))
    session = _session(args)
    result = session.run(settings, progress=_say)
    if args.json:
        print(report.dumps(result.to_dict() | {"measured_speedup": result.measured_speedup}))
        return 0
    colour = not args.no_color and sys.stdout.isatty()
    print(result.prompt_text + report.coloured_text(result.pieces, colour))
    print()
    print(report.legend(colour))
    print("\n".join(report.stats_lines(result.stats, result.baseline, result.measured_speedup, result.measurement)))
    if settings.coupling == "gumbel" and settings.temperature > 0:
        print(f"coupling gumbel: draft-invariant sampling, the text of seed {settings.seed} whatever the draft and "
              "gamma (fewer tokens accepted than with rejection)")
    note = exactness_note(session.load_target(settings.target)[0])  # "" for float32
    if note:
        print(note)
    return 0


def cmd_sweep(args) -> int:
    from tqdm import tqdm

    gammas = parse_gammas(args.gammas)
    if args.repeats < 1:
        raise HfspecError(f"repeats: got {args.repeats}; allowed: an integer >= 1")
    settings = _settings(args)
    specs = [d.strip() for d in (args.drafts or settings.draft).split(",") if d.strip()]
    session = _session(args)
    target, tokenizer = session.load_target(settings.target, progress=_say)
    drafts = {spec: session.load_draft(settings.target, spec, progress=_say) for spec in specs}
    ids = session.encode(settings, tokenizer)
    sampling = settings.sampling_kwargs()
    sampling.pop("seed")
    bar = tqdm(total=len(gammas) * len(drafts), desc="sweep", unit="point", file=sys.stderr,
               disable=not sys.stderr.isatty())
    rows = [r.to_dict() for r in sweep(target, drafts, gammas, ids, sampling, seed=settings.seed,
                                        repeats=args.repeats, check_greedy=not args.no_greedy_check,
                                        on_row=lambda _: bar.update(), options=speculative_options(settings))]
    bar.close()
    if args.csv:
        report.write_csv(rows, args.csv)
    if args.plot:
        report.plot_sweep(rows, args.plot)
    if args.json:
        print(report.dumps({"settings": settings.to_dict(), "gammas": gammas, "rows": rows}))
    else:
        shown = [r | {"measured": report.measured_cell(r)} for r in rows]
        print(report.table(shown, ["draft", "gamma", "alpha", "checked", "tokens_per_pass", "expected_tokens_per_pass",
                                   "c_bytes", "c_time", "predicted_speedup", "measured", "greedy_identical"]))
        if report.row_notes(rows):
            print("\n".join(report.row_notes(rows)))
    return 0


def cmd_compare(args) -> int:
    settings = _settings(args)
    specs = [d.strip() for d in args.drafts.split(",") if d.strip()]
    session = _session(args)
    target, tokenizer = session.load_target(settings.target, progress=_say)
    drafts = {spec: session.load_draft(settings.target, spec, progress=_say) for spec in specs}
    sampling = settings.sampling_kwargs()
    sampling.pop("seed")
    rows = [r.to_dict() for r in sweep(target, drafts, [settings.gamma], session.encode(settings, tokenizer),
                                        sampling, seed=settings.seed, repeats=args.repeats, check_greedy=False,
                                        options=speculative_options(settings))]
    if args.csv:
        report.write_csv(rows, args.csv)
    if args.json:
        print(report.dumps(rows))
    else:
        shown = [r | {"measured": report.measured_cell(r)} for r in rows]
        print(report.table(shown, ["draft", "fidelity", "gamma", "alpha", "tokens_per_pass", "c_bytes", "c_time",
                                   "predicted_speedup", "measured", "tokens_per_second"]))
        if report.row_notes(rows):
            print("\n".join(report.row_notes(rows)))
        print("fidelity: mean Σmin(p, q) of draft and target over the prompt's positions (≈ α at T=1; 1 = same)")
    return 0


def cmd_bench(args) -> int:
    settings = _settings(args)
    session = _session(args)
    target, draft, tokenizer = session.load(settings, progress=_say)
    gamma = args.gamma or (settings.gamma if settings.gamma != "auto" else 4)
    result = compare_methods(target, draft, session.encode(settings, tokenizer), gamma=gamma,
                             temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                             repeats=args.repeats, seed=settings.seed)
    if args.json:
        print(report.dumps(result))
    else:
        rows = [{"method": m, "tokens_per_second": t, "vs_plain": result["speedup_vs_plain"][m],
                 "interval": "{:.2f}–{:.2f}".format(*result["speedup_interval"][m])}
                for m, t in result["tokens_per_second"].items()]
        print(report.table(rows, ["method", "tokens_per_second", "vs_plain", "interval"]))
        print(f"medians of {result['pairs']} interleaved rounds ({result['outliers']} outliers re-measured); "
              f"{'stable' if result['stable'] else 'UNSTABLE'}")
        for text in result["flags"] + result["warnings"]:
            print(f"! {text}")
        print(f"HF assisted ran {result['hf_assistant']}")
        print(f"hfspec / HF assisted: {result['hfspec_vs_assisted']:.2f}×; α {result['alpha']:.3f}; "
              f"hfspec time outside forwards {result['hfspec_time_split']['other']:.1%}")
    return 0


def cmd_audit(args) -> int:
    return run_command(args, progress=_say)


def cmd_sensitivity(args) -> int:
    check_arguments(args.bits, args.group, args.method, args.by, args.tokens)
    if args.json:
        _check_writable(args.json, "--json")
    source = args.target or DEFAULT_PRESET
    if source.endswith(".toml") or source in list_presets():
        source = load_preset(source).target
    target = load_model(source, dtype=args.dtype, progress=_say, role="target")
    result = sensitivity(target, args.bits, args.group, args.method, args.by, args.tokens, args.seed, progress=_say)
    print("\n".join(result.lines()))
    if args.json:
        Path(args.json).expanduser().write_text(report.dumps(result.to_dict() | {"target": source}) + "\n",
                                                encoding="utf-8")
    return 0


def cmd_presets(args) -> int:
    for name in list_presets():
        p = load_preset(name)
        print(f"{name:24s} {'(download) ' if p.needs_download else ''}{p.description}")
    return 0


def cmd_gui(args) -> int:
    require_extra("gui", "gui", "the dashboard")
    from gui.app import main as gui_main

    return gui_main((["--preset", args.preset] if args.preset else []) + (["--run"] if args.run else [])
                    + (["--settings", args.settings] if args.settings else [])
                    + (["--threads", str(args.threads)] if args.threads is not None else []))


def cmd_export_hub(args) -> int:
    folder = export_hub(args.out, draft=args.draft, gamma=args.gamma, overwrite=args.overwrite)
    print(f"wrote {folder}; use it with: model.generate(ids, custom_generate={str(folder)!r}, "
          f"trust_remote_code=True, draft={args.draft!r}, gamma={args.gamma!r}, max_new_tokens=...)")
    return 0


def cmd_export_draft(args) -> int:
    return export_draft_cli(args.target, args.draft, args.out, gamma=args.gamma, dtype=args.dtype,
                            overwrite=args.overwrite, check=not args.no_check, say=_say)


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "compare": cmd_compare, "bench": cmd_bench,
            "presets": cmd_presets, "gui": cmd_gui, "audit": cmd_audit, "sensitivity": cmd_sensitivity,
            "export-hub": cmd_export_hub, "export-draft": cmd_export_draft}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args) or 0
    except HfspecError as error:
        print(f"hfspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["build_parser", "json", "main"]
