"""How long a calibrated (GPTQ) draft takes to build, first time and from its cache, and the memory it needs.

On the real SmolLM2-135M (moved off the grid: `offgrid.py`) and on random-weight models of real decoder shapes
(`bench_scale.py`'s shapes: cost depends on shapes, not values). For each case, in this process: the first
build of `make_draft(target, SPEC)` (the target writes its own calibration text, Hessians layer by layer, GPTQ,
the cache written) with the time of each phase from its progress messages, then a second build from the cache,
and the peak resident memory. The cache goes to a temporary folder, removed after.

    python benchmarks/bench_calibration_time.py --cases smollm2-offgrid,shape:smollm2-1.7b --spec gptq4

Timing of a whole build on one machine: run it on a quiet machine (nothing else running), once per case.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_scale  # noqa: E402
import common  # noqa: E402

from hfspec.drafts import calibrated, make_draft  # noqa: E402
from hfspec.quant.calibrate import Calibration, default_calibration  # noqa: E402

SHAPE_PREFIX = "shape:"


def target_of(case: str, models: dict[str, Path]):
    if case.startswith(SHAPE_PREFIX):
        shapes, _ = bench_scale.load_shapes(str(bench_scale.DEFAULT_SHAPES_FILE))
        name = case[len(SHAPE_PREFIX):]
        if name not in shapes:
            raise SystemExit(f"--cases: unknown shape {name!r}; allowed: {', '.join(shapes)}")
        return bench_scale.random_model(shapes[name], torch.float32).eval()
    if case not in models:
        raise SystemExit(f"--cases: unknown model {case!r}; allowed: {', '.join(models)} or shape:NAME")
    return common.load(models[case], "float32")[0]


def build(target, spec: str, folder: Path, settings: Calibration) -> tuple[float, list[tuple[float, str]], object]:
    """(seconds, [(seconds since start, message)], draft) of one build with the cache in `folder`."""
    saved = calibrated.CALIBRATION_DIR
    calibrated.CALIBRATION_DIR = folder
    messages: list[tuple[float, str]] = []
    watch = common.Stopwatch()
    try:
        def say(message: str) -> None:  # kept for the phases, and shown as it happens (a 1.7B build takes long)
            messages.append((watch.seconds, message))
            print(f"  {watch.seconds:7.1f} s  {message}", file=sys.stderr, flush=True)
        draft = make_draft(target, spec, progress=say, calibration=settings)
    finally:
        calibrated.CALIBRATION_DIR = saved
    return watch.seconds, messages, draft


def phases(messages: list[tuple[float, str]]) -> dict:
    """Seconds at which sampling ended (statistics began) and the last matrix was quantised."""
    out = {}
    for at, m in messages:
        if m.startswith("calibrating: input statistics") and "sampled_s" not in out:
            out["sampled_s"] = at
        if m.startswith("calibrating:") and "matrices quantised" in m:
            out["quantised_s"] = at
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="smollm2-offgrid,shape:smollm2-1.7b",
                   help="model names (as in the other benchmarks) or shape:NAME (random weights)")
    p.add_argument("--spec", default="gptq4")
    p.add_argument("--sequences", type=int, default=None,
                   help="self-sampled calibration sequences (default: hfspec's for the target, default_calibration)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens of each calibration sequence (default: hfspec's for the target)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heap", choices=("kept", "default"), default="kept",
                   help="kept: calibrate inside hfspec.io.memory.kept_heap as hfspec does; default: glibc's own rules "
                        "(the comparison)")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.heap == "default":
        calibrated.memory.kept_heap = contextlib.nullcontext  # (this process only: the comparison's arm)
    models = {name: path for name, path in common.PAIRS.items() if (path / "config.json").exists()}
    lines = [f"{common.machine_name()}, {args.threads} threads, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
             f"draft {args.spec}, calibration text {args.sequences or 'default'} × {args.tokens or 'default'}, heap {args.heap}, load at start {os.getloadavg()[0]:.1f}", "",
             "| target | parameters | text | first build s | sampled at s | quantised at s | cached build s | peak RSS GiB |",
             "|---|---|---|---|---|---|---|---|"]
    rows = []
    for case in args.cases.split(","):
        bench_scale._reset_peak()
        target = target_of(case, models)
        params = sum(t.numel() for t in target.parameters())
        with tempfile.TemporaryDirectory(prefix="hfspec-calib-") as folder:
            settings = default_calibration(target)
            settings = Calibration(sequences=args.sequences or settings.sequences, tokens=args.tokens or settings.tokens)
            first, messages, draft = build(target, args.spec, Path(folder), settings)
            del draft
            again, _, draft = build(target, args.spec, Path(folder), settings)
            del draft
        peak = bench_scale._memory("VmHWM") / 2**30
        ph = phases(messages)
        row = {"case": case, "parameters": params, "first_s": first, "cached_s": again, "peak_rss_gib": peak, **ph,
               "messages": [f"{at:.1f}s {m}" for at, m in messages]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "messages"}), flush=True)
        lines.append(f"| {case} | {params / 1e6:.0f}M | {settings.sequences} × {settings.tokens} | {first:.0f} | {ph.get('sampled_s', float('nan')):.0f} | "
                     f"{ph.get('quantised_s', float('nan')):.0f} | {again:.1f} | {peak:.1f} |")
        del target
    print("\n".join(lines))
    common.write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
