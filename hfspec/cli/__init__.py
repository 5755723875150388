"""`hfspec` command line: run, sweep, compare, bench, profile, audit, sensitivity, presets, gui, export-hub, export-draft.

Verbs only: parse, call the API, print. `hfspec gui` imports the dashboard (Qt, an optional extra) only when run."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from hfspec import report
from hfspec.api import profile_key
from hfspec.audit.command import run_command
from hfspec.audit.exactness import exactness_note
from hfspec.cli.arguments import build_parser, check_args, check_writable
from hfspec.cli.arguments import coupling_arg as _coupling  # the names tests and scripts import
from hfspec.cli.arguments import tree_arg as _tree_arg
from hfspec.decoding import profile as cost_profile
from hfspec.decoding.profile import describe
from hfspec.drafts import parse_draft_spec
from hfspec.drafts.sensitivity import check_arguments, sensitivity
from hfspec.errors import HfspecError
from hfspec.extras import require_extra
from hfspec.hub_export import export_hub
from hfspec.io.export_draft import export_draft_cli
from hfspec.io.loading import load_model
from hfspec.io.presets import DEFAULT_PRESET, list_presets
from hfspec.measure.benchmark import compare_methods
from hfspec.measure.profile import check_profile_arguments, measure_profile, parse_temperatures, summary_lines
from hfspec.measure.sweep import parse_gammas, speculative_options, sweep
from hfspec.session import RunSettings, Session
from hfspec.settings import load_preset


def _settings(args, **extra):
    check_args(args)

    overrides = {k: v for k, v in {
        "target": args.target, "draft": args.draft, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "seed": args.seed, "prompt": args.prompt,
        "gamma": getattr(args, "gamma", None), "early_exit": getattr(args, "early_exit", None) or None,
        "tree": getattr(args, "tree", None), "coupling": getattr(args, "coupling", None),
        "prepack": getattr(args, "prepack", None) or None,
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
    return Session(dtype=args.dtype, device=args.device, prepack=bool(getattr(args, "prepack", False)))


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


def cmd_profile(args) -> int:
    gammas = parse_gammas(args.gammas)
    temperatures = parse_temperatures(args.temperatures)
    settings = _settings(args)
    check_profile_arguments(gammas, temperatures, settings.max_new_tokens, args.repeats)
    session = _session(args)
    target, draft, tokenizer = session.load(settings, progress=_say)
    if args.show:
        found = [(t, cost_profile.find(profile_key(target, draft, t > 0))) for t in temperatures]
        missing = [t for t, (p, _) in found if p is None]
        profiles = [(p, str(path)) for _, (p, path) in found if p is not None]
        for t in missing:
            _say(f"no {'sampled' if t > 0 else 'greedy'} profile saved for these settings: `hfspec profile` "
                 "without --show measures one")
    else:
        profiles = measure_profile(target, draft, session.encode(settings, tokenizer), gammas, temperatures,
                                   settings.max_new_tokens, args.repeats, settings.seed or 0, progress=_say)
    if args.json:
        print(report.dumps([{"path": path, "summary": describe(p), **p.to_dict()} for p, path in profiles]))
    else:
        for p, path in profiles:
            print("\n".join(summary_lines(p, path)))
    return 0 if profiles else 1


def cmd_audit(args) -> int:
    return run_command(args, progress=_say)


def cmd_sensitivity(args) -> int:
    check_arguments(args.bits, args.group, args.method, args.by, args.tokens)
    if args.json:
        check_writable(args.json, "--json")
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


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "compare": cmd_compare, "bench": cmd_bench, "profile": cmd_profile,
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


__all__ = ["_coupling", "_tree_arg", "build_parser", "json", "main"]
