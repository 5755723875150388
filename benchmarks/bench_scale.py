"""What hfspec costs and predicts at real model sizes: random-weight models of real decoder shapes x fp32 / bf16.

    python benchmarks/bench_scale.py                                   # every shape x fp32, bf16 (~15 min, 2 cores)
    python benchmarks/bench_scale.py --shapes smollm2-135m --dtypes bf16 --quick    # a minute: checks it runs
    python benchmarks/bench_scale.py --shapes-file ../shared/models/shapes.json --no-compile

Per shape and dtype, in a fresh subprocess (so peak memory and threads do not leak from one case to the next):
  target step       the target's HF forward over 1 token on a warm cache of --context tokens (ms, median)
  verify / step     its forward over γ + 1 tokens (the verify pass) over the one-token step
  c lean, compiled  the rtn4 draft's lean one-token step (and the compiled one) over the target step
                    (the steps timed by the benchmarks' one operator timer, `common.time_operators`: interleaved
                    rounds, two warm-up rounds not counted, outlier rounds re-measured; ratios are medians of
                    per-round ratios with their interval [low–high]; "steps verdict" is the ruler's verdict)
  build, compile    seconds to build the rtn4 draft, and to compile its step the first time (a fresh inductor
                    cache folder per case, so it is the first-time cost a user pays once)
  memory            resident memory (VmRSS / VmHWM, whole process, so it includes the interpreter's ~0.4 GB)
                    with the target alone, and the peak while building the draft beside it; their ratio
  draft bytes       `weight_bytes(draft) / weight_bytes(target)`
  predicted         E[tokens per pass] / (verify/step + γ·c) at --alpha, for the lean and compiled steps
  prepacked (fp32)  verify / step again with oneDNN-prepacked fp32 weights (`hfspec.kernels.fast_linear`, opt-in: it
                    holds a second fp32 copy of the linear weights), and the lean prediction with it
  end to end        plain `generate` vs `hfspec.generate` (rtn4, greedy) of --e2e-tokens tokens from a short
                    prompt: tokens/s and their ratio. α on random weights means nothing (their distributions are
                    near-uniform noise, so what the draft agrees on says nothing about a trained model): this
                    column checks that the whole path runs at that size and what it costs, not the speed-up
                    (timed by the ruler, `common.timed_rounds`: a warm-up round not counted, --e2e-repeats
                    interleaved rounds, wall clock; "e2e verdict" is its verdict)
Weights are random (normal, std 0.02; norms 1): cost depends on shapes, not values. The α used for the
prediction is the one measured on the real SmolLM2-135M-Instruct with its rtn4 draft (greedy, γ 4; README's
speed-up table: 0.924), passed with --alpha.

Output: a markdown table on stdout (and in --out .md) and every number in JSON (--out .json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from common import (
    Stopwatch,
    op_ms,
    time_operators,
    time_ratio,
    timed_rounds,
    verdict_cell,
    verdict_columns,
    wall,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SHAPES_FILE = REPO.parent / "shared" / "models" / "shapes.json"
# decoder shapes of the real checkpoints (their public config.json), used when no shapes file is given/present
SHAPES = {
    "smollm2-135m": {"arch": "LlamaForCausalLM", "hidden_size": 576, "intermediate_size": 1536,
                     "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-05},
    "smollm2-360m": {"arch": "LlamaForCausalLM", "hidden_size": 960, "intermediate_size": 2560,
                     "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-05},
    "smollm2-1.7b": {"arch": "LlamaForCausalLM", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32,
                     "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 130000.0, "rms_norm_eps": 1e-05},
    "qwen2.5-0.5b": {"arch": "Qwen2ForCausalLM", "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06},
    "qwen2.5-1.5b": {"arch": "Qwen2ForCausalLM", "hidden_size": 1536, "intermediate_size": 8960,
                     "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06},
    "llama-3.2-1b": {"arch": "LlamaForCausalLM", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "vocab_size": 128256, "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-05},
}
ALPHA_SMOLLM2 = 0.924  # README speed-up table: SmolLM2-135M-Instruct, rtn4 draft, greedy, γ 4 (real weights)
DTYPES = ("fp32", "bf16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="all", help=f"comma-separated shape names, or all ({', '.join(SHAPES)})")
    p.add_argument("--shapes-file", default=str(DEFAULT_SHAPES_FILE),
                   help="JSON of decoder shapes (../shared/models/shapes.json); the built-in copy is used when "
                        "it is absent")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--context", type=int, default=64, help="tokens in the cache before each timed step")
    p.add_argument("--repeats", type=int, default=7, help="interleaved timed steps per method (median)")
    p.add_argument("--alpha", type=float, default=ALPHA_SMOLLM2,
                   help=f"acceptance rate for the prediction (default {ALPHA_SMOLLM2}: measured on the real "
                        "SmolLM2-135M with rtn4, greedy, γ 4)")
    p.add_argument("--e2e-tokens", type=int, default=32, help="new tokens of the end-to-end decode (0: skip)")
    p.add_argument("--e2e-repeats", type=int, default=1,
                   help="interleaved (plain, hfspec) end-to-end rounds after a warm-up round")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled draft step (its columns stay empty)")
    p.add_argument("--compile-dtypes", default="bf16",
                   help="dtypes whose compiled step is built and timed (first compiles take 15-60 s each)")
    p.add_argument("--compile-max-params", type=float, default=2.0,
                   help="skip compiling above this many billion parameters")
    p.add_argument("--no-prepack", action="store_true",
                   help="fp32: skip timing the verify pass with oneDNN-prepacked weights (hfspec.kernels.fast_linear; it "
                        "holds a second fp32 copy of the linear weights while it runs)")
    p.add_argument("--quick", action="store_true", help="3 repeats, 8 end-to-end tokens (checks the script runs)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scale"),
                   help="writes OUT.md and OUT.json ('' to print only)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # "shape:dtype": measure one case, print JSON
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.e2e_tokens = min(args.repeats, 3), min(args.e2e_tokens, 8)
    return args


def load_shapes(path: str) -> tuple[dict, str]:
    file = Path(path)
    if file.is_file():
        shapes = {k: v for k, v in json.loads(file.read_text()).items() if not k.startswith("_")}
        return shapes, str(file)
    print(f"# {file} not found: using the shapes built into this script", file=sys.stderr)
    return SHAPES, "built-in"


# ------------------------------------------------------------------------------------------------ one case
def _memory(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def random_model(shape: dict, dtype):
    """A model of `shape` with random weights, built without HF's (slow, float32) initialisation."""
    import torch
    import transformers

    arch = shape["arch"]
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    fields = {k: v for k, v in shape.items() if k not in ("arch", "rope_theta")}
    config = config_cls(**fields, rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]},
                        max_position_embeddings=4096, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    with torch.device("meta"):
        model = getattr(transformers, arch)(config).to(dtype)
    model = model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.fill_(1.0) if "norm" in name else param.zero_()
            else:
                for rows in param.split(4096):  # in blocks: no full-size fp32 scratch for bf16 weights
                    rows.copy_(torch.randn(rows.shape, generator=gen) * 0.02)
        # rotary inverse frequencies are computed at construction: redo it off the meta device
        model.model.rotary_emb = type(model.model.rotary_emb)(config)
    model.tie_weights()
    return model.eval()


def step_timer(model, ids, context: int, width: int):
    """bench_steps' timer of one forward over ids[:, context:context+width] on a warm cache (imported late: this
    script's parent process stays free of torch)."""
    from bench_steps import step_timer as timer

    return timer(model, ids, context, width)


def measure(args, name: str, shape: dict, dtype_name: str) -> dict:
    import torch

    import hfspec
    from hfspec.decoding.stats import expected_tokens_per_pass
    from hfspec.drafts import weight_bytes

    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    out = {"shape": name, "dtype": dtype_name, "threads": args.threads, "gamma": args.gamma, "alpha": args.alpha}
    watch = Stopwatch()
    target = random_model(shape, dtype)
    out["target_build_s"] = watch.seconds
    out["params_b"] = sum(p.numel() for p in target.parameters()) / 1e9
    out["target_gb"] = weight_bytes(target) / 1e9
    out["rss_target_gb"] = _memory("VmRSS") / 1e9
    _reset_peak()
    watch = Stopwatch()
    lean = hfspec.make_draft(target, "rtn4")
    out["draft_build_s"] = watch.seconds
    out["peak_with_draft_gb"] = _memory("VmHWM") / 1e9
    out["peak_ratio"] = out["peak_with_draft_gb"] / out["rss_target_gb"]
    out["draft_bytes_ratio"] = weight_bytes(lean) / weight_bytes(target)
    compiled = None
    compile_this = (not args.no_compile and dtype_name in args.compile_dtypes.split(",")
                    and out["params_b"] <= args.compile_max_params)
    if compile_this:
        from hfspec.kernels import compiled as compiled_module

        with tempfile.TemporaryDirectory() as folder:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            compiled_module.COMPILE_DIR = Path(folder)  # a fresh folder: the first-time compile
            watch = Stopwatch()
            compiled = hfspec.make_draft(target, "rtn4-compiled")
            out["compiled_build_s"] = watch.seconds
            out["compile_s"] = compiled.compiled_step.seconds if compiled.compiled_step else None
            out["compiled_path"] = hfspec.drafts.describe(compiled)["step"]
    ids = torch.randint(2, shape["vocab_size"], (1, args.context + args.gamma + 1),
                        generator=torch.Generator().manual_seed(1))
    timers = {"step": step_timer(target, ids, args.context, 1),
              "verify": step_timer(target, ids, args.context, args.gamma + 1),
              "lean": step_timer(lean, ids, args.context, 1)}
    if compiled is not None and compiled.compiled_step is not None:
        timers["compiled"] = step_timer(compiled, ids, args.context, 1)
    timings = time_operators(timers, args.repeats, baseline="step")
    out.update({f"{k}_ms": op_ms(timings, k).median for k in timers})
    ratio = {k: time_ratio(timings, k, "step") for k in timers if k != "step"}
    out["verify_ratio"], out["verify_ratio_low"], out["verify_ratio_high"] = ratio["verify"]
    out.update({f"steps_{k}": v for k, v in verdict_columns(timings).items()})
    tokens = expected_tokens_per_pass(args.alpha, args.gamma)
    for kind in ("lean", "compiled"):
        if kind in ratio:
            out[f"c_{kind}"], out[f"c_{kind}_low"], out[f"c_{kind}_high"] = ratio[kind]
            out[f"predicted_{kind}"] = tokens / (out["verify_ratio"] + args.gamma * out[f"c_{kind}"])
    if dtype_name == "fp32" and not args.no_prepack:
        out.update(prepacked(args, target, ids, out, tokens))
    if args.e2e_tokens:
        out.update(end_to_end(args, target, lean, shape))
    return out


def prepacked(args, target, ids, out: dict, tokens: float) -> dict:
    """The verify pass with oneDNN-prepacked fp32 weights (`hfspec.kernels.fast_linear`), timed beside the one-token
    step (which keeps F.linear), then undone."""
    from hfspec.kernels import fast_linear

    added = fast_linear.prepack(target)
    if not added:
        return {}
    try:
        timers = {"step": step_timer(target, ids, args.context, 1),
                  "verify": step_timer(target, ids, args.context, args.gamma + 1)}
        timings = time_operators(timers, args.repeats, baseline="step")
        ratio, low, high = time_ratio(timings, "verify", "step")
    finally:
        fast_linear.unprepack(target)
    row = {"prepacked_gb": added / 1e9, "verify_ratio_prepacked": ratio, "verify_ratio_prepacked_low": low,
           "verify_ratio_prepacked_high": high, **{f"prepacked_{k}": v for k, v in verdict_columns(timings).items()}}
    for kind in ("lean", "compiled"):
        if f"c_{kind}" in out:
            row[f"predicted_{kind}_prepacked"] = tokens / (ratio + args.gamma * out[f"c_{kind}"])
    return row


def end_to_end(args, target, draft, shape: dict) -> dict:
    import torch

    import hfspec

    prompt = torch.randint(2, shape["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(2))
    n = args.e2e_tokens
    kwargs = dict(max_new_tokens=n, do_sample=False)  # no EOS in these configs: every run makes n tokens
    def plain(r):
        with torch.no_grad():
            return target.generate(prompt, **kwargs)

    def spec(r):
        with torch.no_grad():
            return hfspec.generate(target, prompt, draft=draft, gamma=args.gamma, **kwargs)

    timings = timed_rounds({"plain": wall(plain, n), "hfspec": wall(spec, lambda out: out.stats.new_tokens)},
                           args.e2e_repeats, seed=0)
    r = timings.ratio("hfspec")
    stats = timings.kept[-1]["hfspec"].out.stats
    return {"e2e_tokens": n, "e2e_plain_tok_s": r.baseline_tokens_per_second, "e2e_spec_tok_s": r.tokens_per_second,
            "e2e_speedup": r.median, "e2e_speedup_low": r.low, "e2e_speedup_high": r.high,
            "e2e_alpha_random_weights": stats.alpha, **{f"e2e_{k}": v for k, v in verdict_columns(timings).items()}}


# ------------------------------------------------------------------------------------------------ table
def _f(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _iv(row: dict, key: str) -> str:
    """"1.23 [1.10–1.40]" from row[key] and its _low/_high ("–" when absent)."""
    if row.get(key) is None:
        return "–"
    low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
    return f"{row[key]:.2f}" + ("" if low is None or high is None else f" [{low:.2f}–{high:.2f}]")


def _verdict(row: dict, prefix: str) -> str:
    if f"{prefix}stable" not in row:
        return "–"
    return verdict_cell({k: row.get(prefix + k) for k in ("pairs", "stable", "warnings", "flags")})


def table(rows: list[dict], args) -> str:
    head = (f"threads {args.threads}, context {args.context}, γ {args.gamma}, median of {args.repeats} interleaved "
            f"steps after two warm-up rounds (ratios: median of per-round ratios [interval]); predicted at α {args.alpha} (real SmolLM2-135M, rtn4); end to end on random weights "
            f"(α there means nothing)\n\n"
            "| shape | dtype | params (B) | target step ms | verify / step | c lean | c compiled | predicted lean "
            "| predicted compiled | verify / step prepacked | predicted lean prepacked | draft build s "
            "| first compile s | draft bytes / target | RSS target GB | peak +draft GB | peak ratio | steps verdict "
            "| e2e plain tok/s | e2e hfspec tok/s | e2e × | e2e verdict |\n" + "|---" * 22 + "|\n")
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['dtype']} | failed: {r['error']} |" + " |" * 19)
            continue
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['params_b']:.2f} | {r['step_ms']:.1f} | {_iv(r, 'verify_ratio')} "
            f"| {_iv(r, 'c_lean')} | {_iv(r, 'c_compiled')} | {r['predicted_lean']:.2f}× "
            f"| {_f(r.get('predicted_compiled'), '.2f')}{'×' if r.get('predicted_compiled') else ''} "
            f"| {_iv(r, 'verify_ratio_prepacked')} | {_f(r.get('predicted_lean_prepacked'), '.2f')}"
            f"{'×' if r.get('predicted_lean_prepacked') else ''} "
            f"| {r['draft_build_s']:.1f} | {_f(r.get('compile_s'), '.0f')} | {r['draft_bytes_ratio']:.3f} "
            f"| {r['rss_target_gb']:.2f} | {r['peak_with_draft_gb']:.2f} | {r['peak_ratio']:.2f} "
            f"| {_verdict(r, 'steps_')} | {_f(r.get('e2e_plain_tok_s'), '.1f')} | {_f(r.get('e2e_spec_tok_s'), '.1f')} "
            f"| {_iv(r, 'e2e_speedup')} | {_verdict(r, 'e2e_')} |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    shapes, source = load_shapes(args.shapes_file)
    if args.worker:
        name, dtype = args.worker.split(":")
        print(json.dumps(measure(args, name, shapes[name], dtype)))
        return
    names = list(shapes) if args.shapes == "all" else [s.strip() for s in args.shapes.split(",")]
    unknown = [n for n in names if n not in shapes]
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    bad = [d for d in dtypes if d not in DTYPES]
    if unknown or bad:
        sys.exit(f"--shapes: unknown {unknown} (allowed: {', '.join(shapes)}); " if unknown else
                 f"--dtypes: unknown {bad} (allowed: {', '.join(DTYPES)})")
    rows = []
    for name in names:
        for dtype in dtypes:
            cmd = [sys.executable, __file__, "--worker", f"{name}:{dtype}", *_forwarded(argv)]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
                       PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
            watch = Stopwatch()  # the whole case, one-shot: it compares nothing
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                print(f"# {name} {dtype}: failed ({why})", file=sys.stderr)
                rows.append({"shape": name, "dtype": dtype, "error": why})
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["case_s"] = watch.seconds
            print(f"# {name} {dtype}: {row['case_s']:.0f} s", file=sys.stderr, flush=True)
            rows.append(row)
    text = table(rows, args)
    print(text)
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                "load_average_at_end": os.getloadavg(), "shapes_from": source, "args": vars(args)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


def _forwarded(argv) -> list[str]:
    """The parent's options for a worker (everything but --out and the shape / dtype lists)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in ("--out", "--shapes", "--dtypes"):
            skip = True
            continue
        if item.startswith(("--out=", "--shapes=", "--dtypes=")):
            continue
        out.append(item)
    return out


if __name__ == "__main__":
    main()
