"""`hfspec audit`: an exactness audit of a target and its draft, on this machine, in this dtype.

Two checks, each with a control that must fail so that a pass means something:

1. Greedy: `generate` and `hfspec.generate` at temperature 0 on several prompts, every first difference
   explained by the target's margin against the measured rounding difference (`hfspec.audit.exactness`). The
   controls of that check live in its tests (a verify that accepts the target's second choice fails it).
2. Sampling: the joint law of the first two generated tokens, drawn `samples` times by `hfspec.generate`, is
   compared by χ² with the law plain sampling draws from: `generate`'s own processed scores at those
   positions (softmax of the scores it samples from: token 1 after the context, token 2 after context + t1
   for every t1 expected at least 5 times). At T = 1 and at the user's settings. Control: a draft-only
   sampler (the draft's own samples under the same settings) on the same cells must fail.

Power. Speculative decoding can only go wrong where the draft's q differs from the target's p, so the
context is chosen, before any sample is drawn, where a draft-only sampler is easiest to tell from the target:
among each prompt plus 0-8 tokens of its greedy continuation, the context whose first-token law gives the
largest χ² non-centrality n Σ (q − p)² / p over the test's cells. The test's cells: a (t1, t2) pair expected
≥ 5 times; the rest of each t1's row; every t1 expected < 5 times together; cells still below 5 pooled. The
output states the control's predicted power (normal approximation of the non-central χ²). Token 2 tests what
follows an accepted or rejected first token (the next draft position, or a new round after a residual draw).
EOS is masked for both tokens (min_new_tokens = 2) on both sides. The χ² cells, statistic, p-value and the
control's power are `hfspec.audit.chi2`'; what to run is an `AuditSettings`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields, replace

import torch

from hfspec import report
from hfspec.api import generate, make_draft
from hfspec.audit.chi2 import MIN_EXPECTED, Cells, SamplingTest, chi2_isf, chi2_sf, draft_only_samples
from hfspec.audit.exactness import GreedyReport, check_greedy, dtype_of, exactness_note, use_bitwise_verify
from hfspec.decoding.sampling import warp
from hfspec.decoding.scoring import fit_vocab
from hfspec.drafts import parse_draft_spec
from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError
from hfspec.io.loading import parse_device, parse_dtype
from hfspec.session import RunSettings, Session
from hfspec.validate import check_count, check_gamma, check_sampling, check_seed, eos_ids, vocab_size

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time,",
                   "The most important thing to know about")
DEFAULT_TOKENS = 64
DEFAULT_SAMPLES = None  # auto: the first of AUTO_SAMPLES at which the control fails with AUTO_POWER
AUTO_SAMPLES = (500, 1000, 2000, 4000)
AUTO_POWER = 0.99
THRESHOLD = 1e-3  # p-value below which a test fails (and the control must fall)
CONTEXT_SPAN = 8  # candidate contexts: each prompt plus 0..CONTEXT_SPAN tokens of its greedy continuation
MAX_FIRST = 64  # first tokens whose second-token law gets its own cells
NEW = 2  # generated tokens whose joint law is tested

__all__ = [  # the χ² names (`hfspec.audit.chi2`) stay importable from here
    "AUTO_POWER", "AUTO_SAMPLES", "CONTEXT_SPAN", "DEFAULT_PROMPTS", "DEFAULT_SAMPLES", "DEFAULT_TOKENS", "MAX_FIRST",
    "MIN_EXPECTED", "NEW", "THRESHOLD", "AuditResult", "AuditSettings", "Cells", "SamplingTest", "audit",
    "check_options", "chi2_isf", "chi2_sf", "choose_context", "draft_law", "draft_only_samples", "plain_law",
    "run_command", "sampling_tests",
]


@dataclass
class AuditResult:
    target: str
    draft: str
    dtype: str
    gamma: int
    seed: int
    greedy: GreedyReport
    sampling: list[SamplingTest] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.greedy.passed and all(test.passed for test in self.sampling)

    def lines(self, tokenizer=None) -> list[str]:
        g = self.greedy
        out = [f"hfspec audit: target {self.target}, draft {self.draft}, {self.dtype}, gamma {self.gamma}, "
               f"seed {self.seed}"]
        note = exactness_note(self.dtype)
        if note:
            out.append(note)
        out.append(f"{'PASS' if g.passed else 'FAIL'}  greedy vs generate: {len(g.rows)} prompts x {g.max_new_tokens} "
                   f"tokens, {g.differences} differ (each must be a near-tie: margin <= {g.safety:g} x rounding)")
        out += ["      " + line for line in g.lines(tokenizer)]
        for test in self.sampling:
            out.append(test.line())
            if not test.control:
                context = tokenizer.decode(test.context) if tokenizer is not None else str(test.context)
                out.append(f"      first {NEW} tokens after {context!r}")
        out += self.notes
        out.append(f"{'PASSED' if self.passed else 'FAILED'} in {self.seconds:.0f} s")
        return out

    def to_dict(self) -> dict:
        data = asdict(self) | {"passed": self.passed}
        data["greedy"] = self.greedy.to_dict()
        for test, raw in zip(self.sampling, data["sampling"], strict=True):
            raw["passed"] = test.passed
        return data


def check_options(tokens: int, samples: int, temperature, top_k, top_p, gamma, seed) -> None:
    """HfspecError naming the field and the allowed values (before any model loads)."""
    check_count("tokens", tokens, 1)
    if samples is not None:
        check_count("samples", samples, 100)
    check_sampling(temperature, top_k, top_p)
    check_gamma(gamma, fixed="the audit runs a fixed gamma")
    check_seed(seed, optional=False, unsigned=True, bits=63)


@dataclass
class AuditSettings:
    """What an audit runs. tokens: greedy tokens per prompt. samples: per χ² test, None for auto (see
    `sampling_tests`). temperature/top_k/top_p: the user's sampling settings (tested beside T = 1 when they differ
    from it; temperature 0 tests greedy only). threshold: the p-value below which a test fails. target_name /
    draft_name: the report's labels (default: the models' class names, or the draft's spec string)."""

    tokens: int = DEFAULT_TOKENS
    samples: int | None = DEFAULT_SAMPLES
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    gamma: int = 4
    seed: int = 0
    threshold: float = THRESHOLD
    target_name: str = ""
    draft_name: str = ""

    @classmethod
    def of(cls, settings: AuditSettings | None = None, **options) -> AuditSettings:
        """`settings` (default: the defaults) with `options` (field names) replacing fields."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise TypeError(f"audit: unknown option {unknown[0]!r}; allowed: {', '.join(allowed)}")
        return replace(settings or cls(), **options)

    def check(self) -> None:
        """HfspecError naming the field and the allowed values (before any model loads)."""
        check_options(self.tokens, self.samples, self.temperature, self.top_k, self.top_p, self.gamma, self.seed)

    def sampling_settings(self) -> list[dict]:
        """T = 1, then the user's settings when they sample and differ from it."""
        settings = [{"temperature": 1.0, "top_k": 0, "top_p": 1.0}]
        user = {"temperature": float(self.temperature), "top_k": int(self.top_k or 0),
                "top_p": float(self.top_p or 1.0)}
        if user["temperature"] > 0 and user != settings[0]:
            settings.append(user)
        return settings


def audit(target, draft, prompts=DEFAULT_PROMPTS, settings: AuditSettings | None = None, *, tokenizer=None,
          progress=None, **options) -> AuditResult:
    """Audit `target` with `draft` (a model, or a spec string built from the target). prompts: texts (with a
    tokenizer) or token id lists. settings: an `AuditSettings`; `options` (its field names, e.g. tokens=8,
    samples=400) replace its fields."""
    run = AuditSettings.of(settings, **options)
    run.check()
    say = progress or (lambda message: None)
    began = time.perf_counter()
    draft_name = run.draft_name
    if isinstance(draft, str):
        draft_name = draft_name or draft
        draft = make_draft(target, draft)
    ids = [_ids(prompt, tokenizer) for prompt in prompts]
    if not ids:
        raise HfspecError("prompts: got none; allowed: one or more prompts")
    say(f"greedy: {len(ids)} prompts x {run.tokens} tokens, generate vs hfspec…")
    greedy = check_greedy(target, draft, ids, max_new_tokens=run.tokens, gamma=run.gamma)
    result = AuditResult(run.target_name or type(target).__name__, draft_name or type(draft).__name__,
                         dtype_str(dtype_of(target)), run.gamma, run.seed, greedy)
    contexts = [(row_ids + row.plain_tokens[:CONTEXT_SPAN], len(row_ids))
                for row_ids, row in zip(ids, greedy.rows, strict=True)]
    for index, setting in enumerate(run.sampling_settings()):
        name = "T=1" if index == 0 else "your settings (" + _describe(setting) + ")"
        say(f"sampling {name}: {run.samples or 'auto'} samples of the first {NEW} tokens…")
        result.sampling += sampling_tests(target, draft, contexts, setting, samples=run.samples, gamma=run.gamma,
                                          seed=run.seed + 1000 * index, threshold=run.threshold, name=name)
    if all(not t.control for t in result.sampling):
        result.notes.append("control: not run (this draft kind has no forward to sample from alone)")
    result.seconds = time.perf_counter() - began
    return result


def sampling_tests(target, draft, contexts: list[tuple[list[int], int]], setting: dict, *, samples: int | None,
                   gamma: int, seed: int,
                   threshold: float = THRESHOLD, name: str = "T=1") -> list[SamplingTest]:
    """The χ² test of hfspec's samples at `setting` and of the draft-only control on the same cells.
    contexts: (token ids, prompt length) pairs, the candidates for `choose_context`. samples None: the fewest of
    AUTO_SAMPLES whose predicted control power reaches AUTO_POWER (the most when none does), chosen from the
    exact laws before any sample is drawn."""
    vocab = _vocab(target)
    eos = eos_ids(target)
    context = choose_context(target, draft, contexts, setting, samples or AUTO_SAMPLES[1], eos)
    p1 = plain_law(target, torch.tensor([context]), setting)[0]
    most = samples or AUTO_SAMPLES[-1]
    firsts = [t for t in torch.argsort(p1, descending=True)[:MAX_FIRST].tolist() if most * p1[t] >= MIN_EXPECTED]
    p2 = dict(zip(firsts, plain_law(target, torch.tensor([context + [t] for t in firsts]), setting), strict=True)) \
        if firsts else {}
    q1 = draft_law(draft, torch.tensor([context]), setting, vocab, eos)
    q2 = {}
    if q1 is not None and firsts:
        q2 = dict(zip(firsts, draft_law(draft, torch.tensor([context + [t] for t in firsts]), setting, vocab, eos),
                      strict=True))
    for n in [samples] if samples else AUTO_SAMPLES:  # auto: the fewest that give the control its power
        cells = Cells(p1, {t: law for t, law in p2.items() if n * p1[t] >= MIN_EXPECTED}, n)
        power = cells.power(q1[0], q2, threshold) if q1 is not None else None
        if power is not None and power >= AUTO_POWER:
            break
    samples = n

    drawn: list[tuple[int, int]] = []
    chunk = max(16, min(1024, (1 << 25) // (vocab * (gamma + 1))))  # bounds the [rows, γ+1, V] logits
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        out = generate(target, torch.tensor([context] * rows), draft=draft, gamma=gamma, max_new_tokens=NEW,
                              min_new_tokens=NEW, seed=seed + start, **setting)
        drawn += [tuple(r) for r in out.sequences[:, len(context):len(context) + NEW].tolist()]
    tests = [cells.test(drawn, f"hfspec {name}", setting, context, threshold)]

    if q1 is not None:
        q_by_first = {t: law for t, law in q2.items() if t in cells.firsts}
        control = cells.test(draft_only_samples(q1[0], q_by_first, samples, seed + 7919),
                             f"control {name}: draft-only sampler", setting, context, threshold, control=True)
        control.predicted_power = power
        tests.append(control)
    return tests


def choose_context(target, draft, contexts: list[tuple[list[int], int]], setting: dict, samples: int,
                   eos: list[int]) -> list[int]:
    """The context (a prompt plus 0..CONTEXT_SPAN greedy tokens) where the draft's first-token law is furthest
    from the target's in χ² terms over cells expected ≥ 5 times: where a wrong rule shows most. Uses no sample."""
    best, best_score = contexts[0][0][: contexts[0][1]], -1.0
    vocab = _vocab(target)
    for ids, prompt_length in contexts:
        batch = torch.tensor([ids])
        with torch.no_grad():
            p_logits = fit_vocab(target(batch).logits[0].float(), vocab)
            q = draft_law(draft, batch, setting, vocab, eos, every_position=True)
        if q is None:
            return best
        p_all = _warp(p_logits, setting, eos)
        for position in range(prompt_length - 1, len(ids)):
            p, qq = p_all[position].double(), q[position].double()
            big = samples * p >= MIN_EXPECTED
            score = float(((qq[big] - p[big]) ** 2 / p[big]).sum())
            rest_p, rest_q = float(p[~big].sum()), float(qq[~big].sum())
            if rest_p > 0:
                score += (rest_q - rest_p) ** 2 / rest_p
            if score > best_score:
                best, best_score = ids[: position + 1], score
    return best


def plain_law(target, ids: torch.Tensor, setting: dict) -> torch.Tensor:
    """[B, V]: the law plain sampling draws the next token from after each row of `ids` (same length), from
    `generate`'s own processed scores (EOS masked as min_new_tokens does)."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=1,
                              min_new_tokens=1, output_scores=True, return_dict_in_generate=True, **setting)
    return fit_vocab(torch.softmax(out.scores[0].float(), dim=-1), _vocab(target))


def draft_law(draft, ids: torch.Tensor, setting: dict, vocab: int, eos: list[int],
              every_position: bool = False) -> torch.Tensor | None:
    """The draft's next-token law under `setting` (reference warper, EOS masked) after each row of `ids`
    ([B, V]; [L, V] over every position of one row with every_position); None when the draft has no forward."""
    if not isinstance(draft, torch.nn.Module):
        return None
    try:
        with torch.no_grad():
            logits = draft(input_ids=ids).logits
    except (HfspecError, TypeError, AttributeError, NotImplementedError):  # e.g. prompt lookup: no forward
        return None
    logits = fit_vocab(logits.float(), vocab)
    return _warp(logits[0] if every_position else logits[:, -1], setting, eos)


def _warp(logits: torch.Tensor, setting: dict, eos: list[int]) -> torch.Tensor:
    logits = logits.clone()
    if eos:
        logits[..., eos] = -math.inf
    top_k = setting.get("top_k") or None
    top_p = setting.get("top_p")
    return warp(logits, temperature=setting["temperature"], top_k=top_k, top_p=top_p if top_p != 1.0 else None)


def _describe(setting: dict) -> str:
    parts = [f"T={setting['temperature']:g}"]
    if setting.get("top_k"):
        parts.append(f"top-k {setting['top_k']}")
    if setting.get("top_p", 1.0) < 1.0:
        parts.append(f"top-p {setting['top_p']:g}")
    return ", ".join(parts)


def _ids(prompt, tokenizer) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise HfspecError("prompts: got text without a tokenizer; allowed: token id lists, or pass tokenizer=")
        ids = tokenizer(prompt).input_ids
    else:
        ids = torch.as_tensor(prompt).flatten().tolist()
    if not ids:
        raise HfspecError(f"prompts: {prompt!r} has no tokens; allowed: a prompt of at least one token")
    return [int(i) for i in ids]


def _vocab(model) -> int:
    return vocab_size(model)


def run_command(args, progress=None) -> int:
    """`hfspec audit` (see `hfspec.cli`): 0 when every check passes, 1 when one fails. The preset fills in what
    the flags leave out; every option is checked before a model loads."""
    preset = RunSettings.from_preset(args.preset)
    target_source = args.target or preset.target
    spec = (args.draft or preset.draft).strip()
    settings = AuditSettings(
        tokens=args.tokens, samples=args.samples,
        temperature=args.temperature if args.temperature is not None else preset.temperature,
        top_k=args.top_k if args.top_k is not None else preset.top_k,
        top_p=args.top_p if args.top_p is not None else preset.top_p,
        gamma=args.gamma if args.gamma is not None else (preset.gamma if preset.gamma != "auto" else 4),
        seed=args.seed if args.seed is not None else preset.seed, target_name=target_source, draft_name=spec)
    prompts = list(args.prompts) if args.prompts else list(DEFAULT_PROMPTS)
    if any(not p.strip() for p in prompts):
        raise HfspecError("prompts: got an empty prompt; allowed: some text to continue")
    settings.check()
    parse_draft_spec(spec)
    if args.dtype:
        parse_dtype(args.dtype, role="target")
    if args.device:
        parse_device(args.device, role="target")

    session = Session(dtype=args.dtype, device=args.device)
    target, tokenizer = session.load_target(target_source, progress=progress)
    draft = session.load_draft(target_source, spec, progress=progress)
    if args.bitwise_verify:
        use_bitwise_verify(target)
    result = audit(target, draft, prompts, settings, tokenizer=tokenizer, progress=progress)
    if args.bitwise_verify:
        result.notes.append("option: bitwise verify (row-wise attention for cached multi-token forwards, prompt "
                            "prefilled alone)")
    if args.json:
        print(report.dumps(result.to_dict()))
    else:
        print("\n".join(result.lines(tokenizer)))
    return 0 if result.passed else 1
