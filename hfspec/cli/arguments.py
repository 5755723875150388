"""The `hfspec` command line's arguments: the parser of every verb, the flags' type converters (their messages
from `hfspec.validate`, as every front end's) and the checks of counts, lists and output files made before
anything loads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hfspec.decoding.coupling import check_coupling
from hfspec.drafts.registry import allowed
from hfspec.errors import HfspecError
from hfspec.extras import require_extra
from hfspec.io.presets import DEFAULT_PRESET
from hfspec.validate import check_count, check_gamma, check_tree


def _refusal(check, text: str) -> str:
    """The message of a field's one check (`hfspec.validate`) for a flag's text it refuses."""
    try:
        check(text)
    except HfspecError as error:
        return str(error)
    raise AssertionError(f"{check.__name__} took {text!r}")


def gamma_arg(text: str):
    """--gamma: "auto" or an integer (its range checked with the other settings)."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_refusal(check_gamma, text)) from None


def coupling_arg(text: str) -> str:
    try:
        check_coupling(text)
    except HfspecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _coupling_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coupling", type=coupling_arg, metavar="{rejection,gumbel}",
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
    p.add_argument("--prepack", action="store_true",
                   help="fp32 targets on the CPU: a oneDNN-prepacked copy of every linear weight (faster steps and "
                        "verify passes on AMD CPUs, little gain on Intel AMX ones; a second fp32 copy of the "
                        "weights in memory)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfspec", description="Exact speculative decoding for HF causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate once; tokens coloured by origin; statistics")
    _common(run)
    run.add_argument("--gamma", type=gamma_arg)
    run.add_argument("--early-exit", action="store_true",
                     help="the draft stops a round early when another token does not pay (γ is the cap)")
    run.add_argument("--tree", type=tree_arg,
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
    compare.add_argument("--gamma", type=gamma_arg)
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

    profile = sub.add_parser("profile", help="time a pair's rounds on this machine and save them: seeded gamma auto "
                             "then prices rounds with them instead of the priors")
    _common(profile)
    profile.add_argument("--gammas", default="2-7", help="the fixed gammas timed (default 2-7)")
    profile.add_argument("--temperatures", default="0,1", help="0 for greedy rounds, one T > 0 for sampled ones "
                         "(default 0,1: both)")
    profile.add_argument("--repeats", type=int, default=2, help="turns of every gamma and plain decoding (default 2)")
    profile.add_argument("--show", action="store_true", help="print the saved profiles for these settings; measure "
                         "nothing")
    profile.add_argument("--json", action="store_true")

    audit = sub.add_parser("audit", help="exactness audit of a target and draft on this machine (exit 0: all pass)")
    _audit_arguments(audit)

    hub = sub.add_parser("export-hub", help="write a transformers custom_generate folder that runs hfspec")
    hub.add_argument("out", metavar="OUT", help="folder to write (new or empty)")
    hub.add_argument("--draft", default="rtn4", help=f"the folder's default draft: {_draft_specs()}")
    hub.add_argument("--gamma", type=gamma_arg, default=4, help="the folder's default gamma (1..64 or auto)")
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


def check_args(args) -> None:
    """Counts, draft lists and output files, checked before anything loads or runs."""
    repeats = getattr(args, "repeats", None)
    if repeats is not None:
        check_count("repeats", repeats, 1)
    drafts = getattr(args, "drafts", None)
    if drafts is not None and not [d for d in drafts.split(",") if d.strip()]:
        raise HfspecError(f"drafts: got {drafts!r}; allowed: comma-separated draft specs, e.g. rtn4,rtn3-g64")
    for flag in ("csv", "plot"):
        if getattr(args, flag, None):
            check_writable(getattr(args, flag), f"--{flag}")
    if getattr(args, "plot", None):
        _check_plot_format(args.plot)


def check_writable(path: str, field: str) -> None:
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


def tree_arg(text: str):
    """--tree: "auto" or an integer (its range checked with the other settings)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_refusal(check_tree, text)) from None
