#!/usr/bin/env python
"""Train hfspec's embedded micro model pair (``micro`` and ``nano``) from scratch, offline.

Corpus: the docstrings of the Python standard library that ships with the interpreter running this
script (module, class and function docstrings found with ``ast``, files walked in sorted order,
``site-packages`` excluded).  The embedded models were trained with CPython 3.11.7; other 3.11.x
patch releases give an almost identical corpus.  A deterministic hash of each file's path decides the
split: about 1 file in 20 is held out and never trained on (nor used to train the tokenizer).

Both models share one byte-level BPE tokenizer (2048 tokens incl. ``<s>``, ``</s>``, ``<pad>``).

Reproduce (about 25 minutes on 2 CPU cores)::

    python presets/train_micro.py --out presets/models

Only measure the expected acceptance rate of quantised / nano drafts for existing models::

    python presets/train_micro.py --out presets/models --eval-only
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB_SIZE = 2048
SPECIALS = ["<s>", "</s>", "<pad>"]
HELDOUT_MOD = 20  # file is held out when sha256(relpath) % HELDOUT_MOD == 0

MODEL_SPECS = {
    # name: (llama config overrides, training steps, peak lr)
    "micro": (dict(hidden_size=160, intermediate_size=544, num_hidden_layers=4, num_attention_heads=5,
                   num_key_value_heads=5, head_dim=32), 1700, 3e-3),
    "nano": (dict(hidden_size=160, intermediate_size=544, num_hidden_layers=1, num_attention_heads=5,
                  num_key_value_heads=5, head_dim=32), 1400, 4e-3),
}
SEQ_LEN = 256
BATCH = 8
WARMUP = 60
SEED = 1234


# ----------------------------------------------------------------------------------------- corpus
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def build_corpus(root: Path) -> tuple[list[str], list[str], dict]:
    """Return (train_docs, heldout_docs, info).  Exact duplicates are dropped (first occurrence wins,
    and a held-out docstring that also appears in a training file is dropped from the held-out set)."""
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    train, heldout = [], []
    n_files = [0, 0]
    for p in files:
        rel = p.relative_to(root).as_posix()
        try:
            tree = ast.parse(p.read_bytes())
        except (SyntaxError, ValueError):
            continue  # a few deliberately broken test files
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node, clean=True)
                if d and len(d.strip()) >= 8:
                    docs.append(d.strip())
        h = is_heldout(rel)
        n_files[h] += 1
        (heldout if h else train).extend(docs)
    seen: set[str] = set()
    train_u = []
    for d in train:
        if d not in seen:
            seen.add(d)
            train_u.append(d)
    held_u = []
    for d in heldout:
        if d not in seen:
            seen.add(d)
            held_u.append(d)
    info = {
        "python": platform.python_version(),
        "stdlib": str(root),
        "train_files": n_files[0],
        "heldout_files": n_files[1],
        "train_docstrings": len(train_u),
        "heldout_docstrings": len(held_u),
        "train_chars": sum(map(len, train_u)),
        "heldout_chars": sum(map(len, held_u)),
    }
    return train_u, held_u, info


# -------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(docs: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def save_tokenizer(tok, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=SEQ_LEN * 2,
    )
    fast.save_pretrained(folder)


def encode_stream(tok, docs: list[str]) -> torch.Tensor:
    """<s> doc </s> <s> doc </s> ... as one long LongTensor."""
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------------- models
def make_config(overrides: dict, tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=SEQ_LEN * 2,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        initializer_range=0.02,
        **overrides,
    )


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def lm_loss(model, x: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), x[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model, windows: torch.Tensor, batch: int = 32) -> float:
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch]
        tot += lm_loss(model, x).item() * x.size(0)
        n += x.size(0)
    model.train()
    return tot / n


def windows_of(stream: torch.Tensor, length: int) -> torch.Tensor:
    n = (len(stream) - 1) // length
    return torch.stack([stream[i * length : i * length + length + 1] for i in range(n)])


def train_model(name: str, tok, train_stream, held_windows, log, max_steps=None) -> tuple[object, dict]:
    from transformers import LlamaForCausalLM

    overrides, steps, lr = MODEL_SPECS[name]
    steps = min(steps, max_steps or steps)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(make_config(overrides, tok)).float()
    model.train()
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = torch.Generator().manual_seed(SEED + 1)
    max_start = len(train_stream) - SEQ_LEN - 2
    t0 = time.perf_counter()
    hist = []
    for step in range(steps):
        if step < WARMUP:
            cur = lr * (step + 1) / WARMUP
        else:
            prog = (step - WARMUP) / max(1, steps - WARMUP)
            cur = lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog)))
        for g in opt.param_groups:
            g["lr"] = cur
        starts = torch.randint(0, max_start, (BATCH,), generator=gen)
        x = torch.stack([train_stream[s : s + SEQ_LEN + 1] for s in starts.tolist()])
        loss = lm_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            el = time.perf_counter() - t0
            msg = f"[{name}] step {step}/{steps} loss {loss.item():.4f} lr {cur:.2e} {el:.0f}s"
            if step % 200 == 0 or step == steps - 1:
                hl = eval_loss(model, held_windows[:48])  # a fixed subset; full set at the end
                hist.append((step, hl))
                msg += f" heldout {hl:.4f}"
            log(msg)
    wall = time.perf_counter() - t0
    held = eval_loss(model, held_windows)
    info = {
        "params": n_params(model),
        "steps": steps,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "tokens_seen": steps * BATCH * SEQ_LEN,
        "peak_lr": lr,
        "train_wall_s": round(wall, 1),
        "heldout_loss": round(held, 4),
        "heldout_ppl": round(math.exp(held), 2),
        "heldout_curve": hist,
    }
    return model, info


def save_model(model, tok, folder: Path, info: dict) -> None:
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    model.config.architectures = ["LlamaForCausalLM"]
    # Weights are stored in float16 to halve the files; config.dtype stays float32, so that
    # from_pretrained() (dtype "auto") upcasts them and the models run in float32 on CPU.
    model.half().save_pretrained(folder, safe_serialization=True)
    model.float()
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    GenerationConfig(
        bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"), do_sample=True, temperature=1.0, max_new_tokens=64,
    ).save_pretrained(folder)
    save_tokenizer(tok, folder)
    (folder / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


# ------------------------------------------------------------------------------ quality estimates
def fake_quant_rtn(model, bits: int, group: int = 32):
    """Copy of ``model`` with every >=2-D weight (embeddings included) replaced by its
    group-wise asymmetric round-to-nearest reconstruction (groups along the input dimension)."""
    import copy

    q = copy.deepcopy(model)
    levels = 2**bits - 1
    with torch.no_grad():
        for p in q.parameters():
            if p.dim() < 2:
                continue
            w = p.data.float().reshape(-1, group)
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
            scale = ((hi - lo) / levels).clamp_min(1e-8)
            zero = torch.round(-lo / scale)
            qw = (torch.clamp(torch.round(w / scale) + zero, 0, levels) - zero) * scale
            p.data.copy_(qw.reshape(p.shape))
    return q


@torch.no_grad()
def acceptance(target, draft, windows: torch.Tensor, batch: int = 32) -> float:
    """Mean over positions of sum_v min(p_target, p_draft) at temperature 1 (= expected alpha)."""
    tot, n = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch, :-1]
        p = target(input_ids=x, use_cache=False).logits.float().softmax(-1)
        q = draft(input_ids=x, use_cache=False).logits.float().softmax(-1)
        a = torch.minimum(p, q).sum(-1)
        tot += a.sum().item()
        n += a.numel()
    return tot / n


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, n: int = 24) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0], skip_special_tokens=True)


def evaluate(out: Path, held_windows: torch.Tensor, log) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    micro = AutoModelForCausalLM.from_pretrained(out / "micro").eval()
    has_nano = (out / "nano" / "config.json").is_file()
    nano = AutoModelForCausalLM.from_pretrained(out / "nano").eval() if has_nano else None
    tokz = AutoTokenizer.from_pretrained(out / "micro")
    res = {}
    for label, draft in [
        ("rtn8", fake_quant_rtn(micro, 8)),
        ("rtn4", fake_quant_rtn(micro, 4)),
        ("rtn3", fake_quant_rtn(micro, 3)),
        ("rtn3-g64", fake_quant_rtn(micro, 3, 64)),
        ("rtn2", fake_quant_rtn(micro, 2)),
        ("nano", nano),
    ]:
        if draft is None:
            continue
        res[label] = round(acceptance(micro, draft, held_windows), 4)
        log(f"alpha(micro <- {label}) = {res[label]:.4f}")
    samples = {p: greedy(micro, tokz, p) for p in ["The attention", "Return the", "This module"]}
    for p, s in samples.items():
        log(f"micro greedy {p!r}: {s!r}")
    samples_nano = {p: greedy(nano, tokz, p) for p in ["Return the"]} if nano is not None else {}
    for p, s in samples_nano.items():
        log(f"nano greedy {p!r}: {s!r}")
    return {"alpha": res, "greedy_micro": samples, "greedy_nano": samples_nano}


# ------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=sorted(MODEL_SPECS), action="append",
                    help="train only this model (repeatable); the tokenizer is always rebuilt")
    ap.add_argument("--eval-only", action="store_true", help="skip training, only measure alpha")
    ap.add_argument("--eval-windows", type=int, default=96, help="held-out windows used for alpha")
    ap.add_argument("--max-steps", type=int, default=None, help=argparse.SUPPRESS)  # smoke tests only
    ap.add_argument("--micro-steps", type=int, default=None, help=f"default {MODEL_SPECS['micro'][1]}")
    ap.add_argument("--nano-steps", type=int, default=None, help=f"default {MODEL_SPECS['nano'][1]}")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    for name in MODEL_SPECS:
        steps = getattr(args, f"{name}_steps")
        if steps:
            cfg, _, lr = MODEL_SPECS[name]
            MODEL_SPECS[name] = (cfg, steps, lr)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    t_all = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_all:7.1f}s] {msg}", flush=True)

    train_docs, held_docs, corpus = build_corpus(stdlib_root())
    log(f"corpus: {json.dumps(corpus)}")
    tok = train_tokenizer(train_docs)
    train_stream = encode_stream(tok, train_docs)
    held_stream = encode_stream(tok, held_docs)
    corpus["train_tokens"] = len(train_stream)
    corpus["heldout_tokens"] = len(held_stream)
    corpus["chars_per_token"] = round(corpus["train_chars"] / len(train_stream), 3)
    log(f"tokens: train {len(train_stream)} heldout {len(held_stream)}")
    held_windows = windows_of(held_stream, SEQ_LEN)
    log(f"prep done ({len(held_windows)} held-out windows)")

    report_path = args.out / "training_report.json"
    report: dict = {"corpus": corpus}
    report["python"] = sys.version.split()[0]
    report["torch"] = torch.__version__
    report["threads"] = args.threads
    if not args.eval_only:
        for name in args.only or ["micro", "nano"]:
            model, info = train_model(name, tok, train_stream, held_windows, log, args.max_steps)
            info["config"] = MODEL_SPECS[name][0]
            save_model(model, tok, args.out / name, {**info, "corpus": corpus})
            report[name] = info
            log(f"{name}: {json.dumps({k: v for k, v in info.items() if k != 'heldout_curve'})}")
        report["wall_s_" + "+".join(args.only or ["micro", "nano"])] = round(time.perf_counter() - t_all, 1)
    g = torch.Generator().manual_seed(SEED + 7)
    sel = held_windows[torch.randperm(len(held_windows), generator=g)[: args.eval_windows]]
    report["eval"] = evaluate(args.out, sel, log)
    report["eval"]["windows"] = len(sel)
    args.out.mkdir(parents=True, exist_ok=True)
    if report_path.exists():  # keep the sections of a model trained by an earlier --only run
        report = json.loads(report_path.read_text()) | report
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    log(f"done; report in {report_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
