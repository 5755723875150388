"""Peak resident memory of a target alone vs. target + quantised draft, each in a fresh process.

    python benchmarks/bench_memory.py                       # SmolLM2-135M fp32 vs + rtn4 draft
    python benchmarks/bench_memory.py --model PATH --draft rtn4 --dtype float32 [--json]

PATH is a model folder, a .gguf file or a hub id (anything hfspec.loading.load_model takes). Default: the
SmolLM2-135M-Instruct folder made by shared/models/get-smollm2.sh ($HFSPEC_SMOLLM2, /tmp/smollm2/hf,
~/.cache/hfspec-models/smollm2-135m-instruct), else its GGUF file (/tmp/smollm2/*.gguf).

Every case runs in its own `python` subprocess (so peaks do not leak from one case into the next) and reads
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after loading, building the draft and running one short forward
pass of each model. The "baseline" case only imports torch/transformers/hfspec, so "model" columns are the
peak above that interpreter baseline.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _peak_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def _current_bytes() -> int | None:
    """Resident set size now (after gc), to tell a steady state from transient peaks."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return int(psutil.Process().memory_info().rss)
        except Exception:
            return None


def default_model() -> str | None:
    candidates = [
        os.environ.get("HFSPEC_SMOLLM2", ""),
        "/tmp/smollm2/hf",
        os.path.expanduser("~/.cache/hfspec-models/smollm2-135m-instruct"),
    ]
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "config.json")):
            return c
    ggufs = sorted(glob.glob("/tmp/smollm2/*.gguf"))
    return ggufs[0] if ggufs else None


def child(case: str, model: str, draft_spec: str, dtype: str) -> dict:
    """Runs inside the fresh subprocess."""
    import torch

    import hfspec
    from hfspec.loading import load_model

    result: dict = {"case": case}
    if case == "baseline":
        result["peak_rss"] = _peak_bytes()
        result["rss_now"] = _current_bytes()
        return result
    t0 = time.perf_counter()
    target = load_model(model, dtype=dtype, device="cpu", progress=False, role="target")
    result["load_s"] = time.perf_counter() - t0
    result["target_params"] = sum(p.numel() for p in target.parameters())
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        target(ids)
    if case == "target+draft":
        t0 = time.perf_counter()
        draft = hfspec.make_draft(target, draft_spec)
        result["draft_s"] = time.perf_counter() - t0
        try:
            from hfspec.drafts import weight_bytes

            result["draft_weight_bytes"] = int(weight_bytes(draft))
            result["target_weight_bytes"] = int(weight_bytes(target))
        except Exception as exc:  # report, do not fail the measurement
            result["weight_bytes_error"] = repr(exc)
        with torch.no_grad():
            draft(ids)
    result["peak_rss"] = _peak_bytes()
    result["rss_now"] = _current_bytes()
    return result


def run_case(case: str, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        case,
        "--model",
        args.model,
        "--draft",
        args.draft,
        "--dtype",
        args.dtype,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"case {case!r} failed (exit {proc.returncode})")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default=None, help="model folder, .gguf file or hub id (default: SmolLM2-135M)"
    )
    ap.add_argument("--draft", default="rtn4", help="draft spec for hfspec.make_draft (default rtn4)")
    ap.add_argument("--dtype", default="float32", help="target dtype (default float32)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child, args.model, args.draft, args.dtype)))
        return 0
    if args.model is None:
        args.model = default_model()
        if args.model is None:
            print(
                "no model given and SmolLM2-135M not found; make it with\n"
                "  shared/models/get-smollm2.sh /tmp/smollm2/hf\nor pass --model PATH",
                file=sys.stderr,
            )
            return 2

    base = run_case("baseline", args)
    alone = run_case("target", args)
    both = run_case("target+draft", args)
    mib = 1024 * 1024
    report = {
        "model": args.model,
        "dtype": args.dtype,
        "draft": args.draft,
        "baseline_peak_rss_mib": base["peak_rss"] / mib,
        "target_peak_rss_mib": alone["peak_rss"] / mib,
        "target_draft_peak_rss_mib": both["peak_rss"] / mib,
        "baseline_rss_end_mib": (base.get("rss_now") or 0) / mib,
        "target_rss_end_mib": (alone.get("rss_now") or 0) / mib,
        "target_draft_rss_end_mib": (both.get("rss_now") or 0) / mib,
        "ratio_total": both["peak_rss"] / alone["peak_rss"],
        "ratio_above_baseline": (both["peak_rss"] - base["peak_rss"])
        / max(1, alone["peak_rss"] - base["peak_rss"]),
        "target_params": alone.get("target_params"),
        "target_weight_bytes": both.get("target_weight_bytes"),
        "draft_weight_bytes": both.get("draft_weight_bytes"),
        "load_s": alone.get("load_s"),
        "make_draft_s": both.get("draft_s"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model: {args.model}  ({args.dtype}; {report['target_params']:,} parameters)")
    print(f"{'case':<28}{'peak RSS':>12}{'above baseline':>18}{'RSS at end':>14}")
    for name, r in (
        ("interpreter baseline", base),
        ("(a) target alone", alone),
        (f"(b) target + {args.draft} draft", both),
    ):
        peak, above = r["peak_rss"] / mib, (r["peak_rss"] - base["peak_rss"]) / mib
        now = f"{r['rss_now'] / mib:>10.1f} MiB" if r.get("rss_now") else f"{'?':>14}"
        print(f"{name:<28}{peak:>9.1f} MiB{above:>14.1f} MiB{now}")
    print(
        f"ratio (b)/(a): {report['ratio_total']:.3f} total, {report['ratio_above_baseline']:.3f} above baseline"
    )
    if report["draft_weight_bytes"]:
        print(
            f"weights: target {report['target_weight_bytes'] / mib:.1f} MiB, "
            f"draft {report['draft_weight_bytes'] / mib:.1f} MiB"
        )
    print(f"load {report['load_s']:.1f} s, make_draft {report['make_draft_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
