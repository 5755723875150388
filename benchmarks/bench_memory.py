"""Peak resident memory of a target alone vs. target + draft, each case in a fresh single-threaded process.

    python benchmarks/bench_memory.py                        # SmolLM2-135M (if present) and micro -> markdown
    python benchmarks/bench_memory.py --models micro --out benchmarks/results/memory.md
    python benchmarks/bench_memory.py --models smollm2 --trace   # where (b)'s peak comes from

Cases (every one a new `python` subprocess with OMP_NUM_THREADS=1, so no peak leaks into the next):
  baseline  import torch / transformers / hfspec only (the interpreter's own RSS)
  (a)       load the target, plain `target.generate` of 128 new tokens (greedy)
  (b)       (a)'s load, then `make_draft(target, "rtn4")` (lean decode step) and `hfspec.generate` of 128 new
            tokens (gamma 4, greedy)
  (c)       as (b) with the Hugging Face-forward rtn4 draft (`make_draft(target, "rtn4", lean=False)`)
  (b')      as (b), but the draft is built after (a)'s plain generate: every target weight is then resident
            (the loader maps the checkpoint file, so right after loading much of it is not), as in a session
            that changes drafts on a loaded target; this exposes the transient peak of building the draft
  (d)       as (b) with lean rtn3 and rtn8 drafts
Peak RSS is the kernel's high-water mark (/proc/self/status VmHWM; ru_maxrss where /proc is missing). Each
phase (load, draft build, generate) gets its own peak by resetting the mark (`echo 5 > /proc/self/clear_refs`)
between phases; the case's peak is the largest. Tensor bytes are `hfspec.drafts.weight_bytes` (storage held once).
Ratios are to (a): of the whole process, and of what lies above the interpreter baseline.

--trace (cases b-d) also reports the peak above the RSS at entry of each call of the functions that build the
draft (group_quantize, group_dequantize, pack_int4_cpu, the lean embedding table, each LeanLinear).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {"smollm2": Path.home() / ".cache" / "hfspec-models" / "smollm2-135m-instruct",
          "micro": REPO / "presets" / "models" / "micro"}
CASES = {  # key: (label, draft spec, lean, draft built after a plain generate)
    "a": ("(a) target alone", None, None, False), "b": ("(b) + rtn4 lean", "rtn4", True, False),
    "bw": ("(b') + rtn4 lean, built on a warm target", "rtn4", True, True),
    "c": ("(c) + rtn4 HF forward", "rtn4", False, False), "d3": ("(d) + rtn3 lean", "rtn3", True, False),
    "d8": ("(d) + rtn8 lean", "rtn8", True, False)}
MIB = 1024 * 1024
PROMPT = "Write a short story about a robot who learns to paint."


# ----------------------------------------------------------------------------------------------- in the child
def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


class PeakMeter:
    """Peak RSS per phase: read the high-water mark, then reset it (when the kernel lets us)."""

    def __init__(self):
        self.phases: dict[str, dict] = {}
        self.carried = 0  # peaks seen before a reset inside the current phase (by CallTracer)
        self.can_reset = self._reset()

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def peak(self) -> int:
        return _status_bytes("VmHWM") or _maxrss_bytes()

    def mark(self, phase: str) -> None:
        self.phases[phase] = {"peak": max(self.peak(), self.carried), "rss_end": _status_bytes("VmRSS")}
        self.carried = 0
        self._reset()


class CallTracer:
    """Wraps functions; per call, the peak RSS above the RSS at entry (nested calls keep the outer peak right)."""

    def __init__(self, meter: PeakMeter):
        self.meter, self.stack, self.calls = meter, [], []

    def wrap(self, owner, name: str, label: str, describe=None) -> None:
        original = getattr(owner, name)
        tracer = self

        def traced(*args, **kwargs):
            tracer._enter()
            try:
                return original(*args, **kwargs)
            finally:
                tracer._leave(label, describe(*args) if describe else "")

        setattr(owner, name, traced)

    def _enter(self) -> None:
        high = self.meter.peak()
        for frame in self.stack:
            frame["peak"] = max(frame["peak"], high)
        self.meter.carried = max(self.meter.carried, high)
        self.meter._reset()
        rss = _status_bytes("VmRSS") or 0
        self.stack.append({"entry": rss, "peak": rss})

    def _leave(self, label: str, detail: str) -> None:
        high = self.meter.peak()
        frame = self.stack.pop()
        frame["peak"] = max(frame["peak"], high)
        for outer in self.stack:
            outer["peak"] = max(outer["peak"], frame["peak"])
        self.calls.append({"call": label, "args": detail, "entry_mib": frame["entry"] / MIB,
                           "above_entry_mib": (frame["peak"] - frame["entry"]) / MIB,
                           "retained_mib": ((_status_bytes("VmRSS") or 0) - frame["entry"]) / MIB})


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) + f" {str(t.dtype).replace('torch.', '')}" if hasattr(t, "shape") else ""


def _install_trace(meter: PeakMeter) -> CallTracer:
    from hfspec.kernels import lean_layers
    from hfspec.quant import groupwise, packing

    tracer = CallTracer(meter)
    tracer.wrap(groupwise, "group_quantize", "group_quantize", lambda w, *a: _shape(w))
    tracer.wrap(groupwise, "group_dequantize", "group_dequantize", lambda q, *a: _shape(q))
    tracer.wrap(packing, "pack_int4_cpu", "pack_int4_cpu", lambda q, *a: _shape(q))
    tracer.wrap(lean_layers.LeanLinear, "__init__", "LeanLinear.__init__", lambda self, w, *a: _shape(w))
    return tracer


def child(case: str, model: str, new_tokens: int, trace: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    import hfspec
    from hfspec.drafts import describe, weight_bytes
    from hfspec.io.loading import load_model, load_tokenizer

    meter = PeakMeter()
    result: dict = {"case": case, "can_reset_peak": meter.can_reset}
    if case == "baseline":
        meter.mark("imports")
        result["phases"] = meter.phases
        return result
    meter.mark("imports")
    torch.manual_seed(0)
    target = load_model(model, dtype="float32", device="cpu", progress=False, role="target")
    ids = load_tokenizer(model)(PROMPT, return_tensors="pt").input_ids
    meter.mark("load")
    result["target_bytes"] = weight_bytes(target)
    spec, lean, warm = CASES[case][1:]
    with torch.no_grad():
        if spec is None or warm:
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False)
            result["new_tokens"] = out.shape[1] - ids.shape[1]
            if warm:
                meter.mark("plain generate")
        tracer = _install_trace(meter) if trace and spec else None
        if spec is not None:
            draft = hfspec.make_draft(target, spec, lean=lean)
            meter.mark("make_draft")
            result["draft_step"] = describe(draft)["step"]
            result["draft_bytes"] = weight_bytes(draft)
            result["held_bytes"] = weight_bytes(torch.nn.ModuleList([target, draft]))  # shared storage once
            out = hfspec.generate(target, ids, draft, gamma=4, temperature=0, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens)
            result["new_tokens"] = out.stats.new_tokens
            result["accepted"] = out.stats.accepted / max(1, out.stats.proposed)
    meter.mark("generate")
    result["phases"] = meter.phases
    if tracer is not None:
        result["trace"] = tracer.calls
    return result


# ----------------------------------------------------------------------------------------------- the parent
def run_case(case: str, model: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", case, "--model", model, "--max-new-tokens", str(args.max_new_tokens)]
    if args.trace:
        cmd.append("--trace")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"case {case!r} on {model} failed (exit {proc.returncode})")
    result = json.loads(lines[-1])
    result["peak"] = max(p["peak"] for p in result["phases"].values())
    return result


def _mib(n) -> str:
    return f"{n / MIB:.1f}" if n else "-"


def table(name: str, model: str, base: dict, rows: dict) -> list[str]:
    a = rows["a"]
    out = [f"### {name} (`{model}`, float32, {a['target_bytes'] / MIB:.1f} MiB of weights)", "",
           "| case | peak RSS MiB | ×(a) | above baseline MiB | ×(a) above baseline | peak phase | "
           "peak in make_draft MiB | RSS at end MiB | draft tensors MiB | target+draft tensors MiB | new tokens |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    above_a = a["peak"] - base["peak"]
    out.append(f"| baseline (imports) | {_mib(base['peak'])} | | | | | | | | | |")
    for key, r in rows.items():
        phase = max(r["phases"], key=lambda p: r["phases"][p]["peak"])
        build = r["phases"].get("make_draft", {}).get("peak")
        out.append(
            f"| {CASES[key][0]} | {_mib(r['peak'])} | {r['peak'] / a['peak']:.3f} | {_mib(r['peak'] - base['peak'])} "
            f"| {(r['peak'] - base['peak']) / above_a:.3f} | {phase} | {_mib(build)} "
            f"| {_mib(r['phases']['generate']['rss_end'])} | {_mib(r.get('draft_bytes'))} "
            f"| {_mib(r.get('held_bytes') or r['target_bytes'])} | {r['new_tokens']} |")
    out.append("")
    for key, r in rows.items():
        if r.get("draft_step"):
            out.append(f"- {CASES[key][0]}: {r['draft_step']}; draft acceptance {r['accepted']:.2f}")
    return out + [""]


def trace_lines(name: str, rows: dict, top: int = 12) -> list[str]:
    out = []
    for key, r in rows.items():
        calls = sorted(r.get("trace", []), key=lambda c: -c["above_entry_mib"])[:top]
        if not calls:
            continue
        out += [f"#### {name} {CASES[key][0]}: largest transient peaks while building the draft", "",
                "| call | argument | RSS at entry MiB | peak above entry MiB | kept after MiB |", "|---|---|---|---|---|"]
        out += [f"| {c['call']} | {c['args']} | {c['entry_mib']:.1f} | {c['above_entry_mib']:.1f} "
                f"| {c['retained_mib']:.1f} |" for c in calls]
        out.append("")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,micro", help="comma-separated: smollm2, micro, or model folders")
    ap.add_argument("--smollm2", default=str(MODELS["smollm2"]), help="folder made by ../shared/models/get-smollm2.sh")
    ap.add_argument("--cases", default="a,b,bw,c,d3,d8", help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--trace", action="store_true", help="per-call peaks inside make_draft (cases b-d)")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model, args.max_new_tokens, args.trace)))
        return 0
    if args.model is not None:
        ap.error("--model is internal; pass model folders with --models NAME_OR_FOLDER[,...]")
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown or "a" not in cases:
        ap.error(f"--cases: unknown {unknown}; allowed {', '.join(CASES)} (a is required: ratios are to it)")
    MODELS["smollm2"] = Path(args.smollm2)
    lines = ["# Peak memory: target alone vs. target + draft", "",
             f"Command: `{' '.join(['OMP_NUM_THREADS=1 python benchmarks/bench_memory.py', *(argv or sys.argv[1:])])}`",
             f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
             f"{platform.system()} {platform.release()}, Python {platform.python_version()}; each case a fresh "
             "single-threaded process; shared machine (memory, unlike time, is not disturbed by load).", "",
             f"Prompt: {PROMPT!r}; {args.max_new_tokens} new tokens, greedy; drafts run hfspec.generate with gamma 4.",
             ""]
    traces = []
    for name in args.models.split(","):
        model = MODELS.get(name, Path(name))
        if not (model / "config.json").is_file():
            hint = " (make it with ../shared/models/get-smollm2.sh)" if name == "smollm2" else ""
            print(f"# skipping {name}: {model} not found{hint}", file=sys.stderr)
            lines += [f"### {name}: skipped, `{model}` not found", ""]
            continue
        base = run_case("baseline", str(model), args)
        rows = {key: run_case(key, str(model), args) for key in cases}
        if not base.get("can_reset_peak"):
            lines.append("(this kernel refused /proc/self/clear_refs: phase peaks are cumulative)")
        lines += table(name, str(model), base, rows)
        traces += trace_lines(name, rows)
    report = "\n".join(lines + traces).rstrip() + "\n"
    print(report, end="")
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
