"""What "exact" means per dtype, and a check that explains every greedy difference from `generate`.

Speculative decoding scores γ + 1 positions in one target forward; plain `generate` scores one. In exact
arithmetic the logits are the same; in floating point a forward over several rows accumulates its sums in
another order (other matmul blocking, another attention kernel), and the cached keys and values it leaves
behind differ by rounding too. In float32 the differences are ~1e-6 of a logit and no greedy choice has been
seen to flip; in bfloat16 and float16 they are ~1e-2, and where the target's two best tokens are that close
its choice flips (HF's assisted generation differs from `generate` at the same kind of positions).

So the rule, for every dtype: hfspec's greedy text equals `generate`'s token for token, except that at the
first differing position the target's own margin between the two tokens (score of `generate`'s token minus
score of hfspec's) is within `SAFETY` × the rounding difference there: the largest change of any logit at that
position when the same prefix is fed through the target in other chunkings (one token at a time, pairs, blocks
of γ + 1 at every alignment, all at once), and at least one unit in the last place of the dtype at the top
logit's size (the logits are numbers of that dtype, so two computations that differ at all differ by a unit;
the chunkings tried can happen to round alike at a position where the speculative run's did not). A
difference that this does not explain is a bug.

    report = check_greedy(target, "rtn4", prompts, max_new_tokens=64)
    print("\n".join(report.lines(tokenizer))); assert report.passed
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import torch

from hfspec.api import generate, make_draft
from hfspec.attrs import BITWISE_VERIFY, del_attr, has_attr, set_attr
from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError
from hfspec.io.loading import parse_dtype
from hfspec.kernels import cache as kv
from hfspec.kernels import lean_target

# A flip between tokens a and b needs their scores to move towards each other by the whole gap; each moves by
# at most the rounding difference δ, so gap ≤ 2δ. δ is measured from other chunkings of the same prefix than
# the speculative run's own (its cache was built by its own sequence of rounds), so the factor is not tight.
SAFETY = 2.0

NEAR_TIE, UNEXPLAINED, IDENTICAL = "near-tie", "UNEXPLAINED", "identical"



def dtype_of(model_or_dtype) -> torch.dtype:
    """The floating dtype of a model's weights (or a dtype / its name given directly)."""
    if isinstance(model_or_dtype, torch.dtype):
        return model_or_dtype
    if isinstance(model_or_dtype, str):
        parsed = parse_dtype(model_or_dtype, role="exactness")
        if not isinstance(parsed, torch.dtype):
            raise ValueError(f"dtype: got {model_or_dtype!r}; allowed: float32, bfloat16, float16 (not auto)")
        return parsed
    for param in model_or_dtype.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def exactness_note(dtype) -> str:
    """One plain line on what "exact" means for a target of this dtype (a dtype, its name, or a model); "" for
    float32, whose greedy text is the target's token for token (nothing to qualify)."""
    dtype = dtype_of(dtype)
    if dtype == torch.float32:
        return ""
    name = dtype_str(dtype)
    return (f"{name} target: sampling follows the target's distribution and greedy text equals generate's token "
            f"for token except at near-ties (the top two logits closer than {name} rounding, where a one-token "
            "and a multi-token forward can pick differently); check your pair with `hfspec audit`.")


@dataclass
class FirstDifference:
    """One prompt's comparison. `position`: new-token offset of the first difference (None: identical);
    `gap`: generate's score of its own token minus its score of hfspec's token there (≥ the top-2 `margin`);
    `rounding`: the measured rounding difference at that position; `verdict`: identical / near-tie / UNEXPLAINED."""

    prompt: int
    new_tokens: int
    position: int | None = None
    plain_token: int | None = None
    spec_token: int | None = None
    margin: float | None = None
    gap: float | None = None
    rounding: float | None = None
    ulp: float | None = None
    rounding_by_scheme: dict[str, float] = field(default_factory=dict)
    verdict: str = IDENTICAL
    plain_tokens: list[int] = field(default_factory=list, repr=False)  # generate's new tokens

    def line(self, tokenizer=None) -> str:
        if self.position is None:
            return f"prompt {self.prompt}: identical over {self.new_tokens} tokens"

        def show(token):
            if token is None:
                return "(stopped)"
            text = repr(tokenizer.decode([token])) if tokenizer is not None else ""
            return f"{token} {text}".strip()

        head = (f"prompt {self.prompt}: first difference at new token {self.position}: generate "
                f"{show(self.plain_token)} vs hfspec {show(self.spec_token)}")
        if self.gap is None:
            return f"{head} -> {self.verdict} (one run stopped where the other went on)"
        measured = max(self.rounding_by_scheme.values(), default=0.0)
        return (f"{head}; margin {self.gap:.3g} vs {SAFETY:g} x rounding {self.rounding:.3g} (measured {measured:.3g}, "
                f"1 ulp {self.ulp:.3g}) -> {self.verdict}")


@dataclass
class GreedyReport:
    dtype: str
    gamma: int
    max_new_tokens: int
    safety: float
    rows: list[FirstDifference]

    @property
    def passed(self) -> bool:
        return all(row.verdict != UNEXPLAINED for row in self.rows)

    @property
    def differences(self) -> int:
        return sum(row.position is not None for row in self.rows)

    def lines(self, tokenizer=None) -> list[str]:
        return [row.line(tokenizer) for row in self.rows]

    def to_dict(self) -> dict:
        data = asdict(self) | {"passed": self.passed}
        for row in data["rows"]:
            row.pop("plain_tokens")
        return data


def check_greedy(target, draft, prompts, max_new_tokens: int = 64, gamma: int = 4, dtype=None,
                 safety: float = SAFETY, **generate_kwargs) -> GreedyReport:
    """Greedy `target.generate` against greedy `hfspec.generate` on each prompt, the first difference of each
    explained (see the module's docstring).

    draft: a model or a spec string ("rtn4", ...; built from the target as compared). prompts: token id lists
    or [1, L] / [L] tensors. dtype: None compares the target as it is; a dtype compares a converted copy (a
    draft spec is then built from that copy). Extra keyword arguments go to both (e.g. min_new_tokens)."""
    if dtype is not None and dtype_of(dtype) != dtype_of(target):
        target = copy.deepcopy(target).to(dtype_of(dtype))
    if isinstance(draft, str):
        draft = make_draft(target, draft)
    rows = []
    for index, prompt in enumerate(prompts):
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                    output_scores=True, output_logits=True, return_dict_in_generate=True,
                                    temperature=None, top_k=None, top_p=None, **generate_kwargs)
        spec = generate(target, ids, attention_mask=mask, draft=draft, gamma=gamma, temperature=0,
                               max_new_tokens=max_new_tokens, **generate_kwargs)
        rows.append(explain(target, ids, plain, spec.sequences, index, gamma, safety))
    return GreedyReport(dtype_str(dtype_of(target)), gamma, max_new_tokens, safety, rows)


def explain(target, ids: torch.Tensor, plain, spec_sequences: torch.Tensor, index: int, gamma: int,
            safety: float = SAFETY) -> FirstDifference:
    """The first difference between `generate`'s output `plain` (with scores and logits) and hfspec's
    sequences for one prompt `ids` [1, L], with its margin, measured rounding difference and verdict."""
    length = ids.shape[1]
    a = plain.sequences[0, length:].tolist()
    b = spec_sequences[0, length:].tolist()
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    row = FirstDifference(index, max(len(a), len(b)), plain_tokens=a)
    if common == len(a) == len(b):
        return row
    row.position = common
    row.plain_token = a[common] if common < len(a) else None
    row.spec_token = b[common] if common < len(b) else None
    if row.plain_token is None or row.spec_token is None or common >= len(plain.scores):
        row.verdict = UNEXPLAINED  # one stopped where the other went on: not a choice between two tokens
        return row
    scores = plain.scores[common][0].float()
    top2 = scores.topk(2).values
    row.margin = float(top2[0] - top2[1])
    row.gap = float(scores[row.plain_token] - scores[row.spec_token])
    prefix = torch.cat([ids[0], ids.new_tensor(a[:common])]).reshape(1, -1)
    row.rounding_by_scheme = rounding_difference(target, prefix, length, gamma, plain.logits[common][0].float())
    row.ulp = unit_in_last_place(float(plain.logits[common][0].float().max()), dtype_of(target))
    row.rounding = max(*row.rounding_by_scheme.values(), row.ulp)
    row.verdict = NEAR_TIE if row.gap <= safety * row.rounding else UNEXPLAINED
    return row


def unit_in_last_place(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype`'s numbers at |value| (eps × the power of two at or below |value|)."""
    finfo = torch.finfo(dtype)
    magnitude = max(abs(value), finfo.tiny)
    return float(finfo.eps * 2.0 ** math.floor(math.log2(magnitude)))


def rounding_difference(model, prefix: torch.Tensor, prompt_length: int, gamma: int,
                        reference: torch.Tensor) -> dict[str, float]:
    """max |Δ logit| at the last position of `prefix` [1, T] between `reference` (generate's logits there) and
    the same prefix fed in other chunkings after the prompt: one token at a time, pairs and blocks of γ + 1
    at every alignment (the prompt's forward taking the first few new tokens along, as a speculative round's
    first forward does), and everything in one forward; the same through the lean target where a speculative
    decode of `model` takes it. Keys name the scheme: "1", "2@0", "5@3", "all", "lean 5@3"."""
    total = prefix.shape[1]
    schemes = {"1": (prompt_length, 1), "all": (total, total)}
    for chunk in sorted({2, gamma + 1}):
        for shift in range(chunk):
            schemes[f"{chunk}@{shift}"] = (min(prompt_length + shift, total), chunk)
    # where a speculative decode scores through the lean target (`hfspec.kernels.lean_target`), its chunkings too
    lean = lean_target.built(model)[0] if not lean_target.why_not(model) else None
    out = {}
    for prefix_name, runner in [("", model)] + ([("lean ", lean)] if lean is not None else []):
        for name, (first, chunk) in schemes.items():
            logits = last_logits_in_chunks(runner, prefix, first, chunk)
            out[prefix_name + name] = float((logits.float() - reference.to(logits.device)).abs().max())
    return out


@torch.no_grad()
def last_logits_in_chunks(model, ids: torch.Tensor, first: int, chunk: int) -> torch.Tensor:
    """Logits [V] at the last position of `ids` [1, T], feeding ids[:first] in one forward and the rest in
    forwards of `chunk` tokens over the KV cache (as generate and hfspec feed the target)."""
    cache = kv.new_cache(model)
    cache_key = kv.cache_kwarg(model)
    positions = kv.accepts(model, "position_ids")
    total, start, logits = ids.shape[1], 0, None
    end = first
    while start < total:
        kwargs = {"input_ids": ids[:, start:end], cache_key: cache, "use_cache": True}
        if positions:
            kwargs["position_ids"] = torch.arange(start, end, device=ids.device)[None]
        if kv.accepts(model, "logits_to_keep"):
            kwargs["logits_to_keep"] = 1
        outputs = model(**kwargs)
        cache = kv.cache_of(outputs)
        logits = outputs.logits[0, -1]
        start, end = end, min(total, end + chunk)
    return logits


# ------------------------------------------------------------------------------ bitwise option
ROWWISE_ATTENTION = "hfspec_rowwise_sdpa"


def rowwise_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA as transformers calls it, except that a forward of several new tokens over a KV cache attends one
    query row at a time over exactly the keys a one-token forward would see. On CPUs where the matmuls of a few
    rows round like one row (bf16 oneDNN), this makes the (γ + 1)-token verify pass compute bit for bit what
    `generate`'s one-token steps compute; only batch 1 without padding takes this path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows, keys = query.shape[2], key.shape[2]
    if rows == 1 or keys <= rows or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for i in range(rows):
        end = keys - rows + i + 1
        out, _ = sdpa_attention_forward(module, query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], None,
                                        **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


def use_bitwise_verify(model, on: bool = True) -> None:
    """Option: make the target's (γ + 1)-token verify passes compute what `generate`'s one-token steps compute,
    bit for bit, on CPUs whose matmuls over a few rows round like one row (bf16 on oneDNN; fp32 MKL does not).
    Two changes, both to `model` in place (on=False undoes them): cached multi-token forwards attend one query
    row at a time (`rowwise_attention`), and the first forward of a speculative run (prompt + γ draft tokens,
    no cache yet) runs as the prompt's own forward followed by a cached forward of the draft tokens, as
    `generate` prefills the prompt alone. Needs "sdpa" attention; batch 1 without padding."""
    from transformers import AttentionInterface

    current = getattr(model.config, "_attn_implementation", None)
    if current not in ("sdpa", ROWWISE_ATTENTION) or not hasattr(model, "set_attn_implementation"):
        raise HfspecError(f"bitwise verify: the target uses {current!r} attention; allowed: a transformers model "
                          "with 'sdpa' attention")
    AttentionInterface.register(ROWWISE_ATTENTION, rowwise_attention)
    model.set_attn_implementation(ROWWISE_ATTENTION if on else "sdpa")
    if on:  # (the few-row verify kernel, which sums in another order, then leaves this model's passes alone)
        set_attr(model, BITWISE_VERIFY, True)
    elif has_attr(model, BITWISE_VERIFY):
        del_attr(model, BITWISE_VERIFY)
    if on and "forward" not in vars(model):
        model.forward = _split_first_forward(model.forward)
    elif not on and "forward" in vars(model):
        del model.forward


def _split_first_forward(forward):
    """forward, except that a call on an empty cache keeping k > 1 logits of n > k tokens runs as a forward of
    the first n - k + 1 tokens (the prompt) and a cached forward of the remaining k - 1."""

    def split(*args, **kwargs):
        ids = kwargs.get("input_ids")
        keep = kwargs.get("logits_to_keep")
        cache_key = "cache" if "cache" in kwargs else "past_key_values"
        cache = kwargs.get(cache_key)
        if (args or ids is None or not isinstance(keep, int) or keep <= 1 or ids.shape[1] <= keep
                or cache is None or kv.seq_length(cache) > 0 or kwargs.get("attention_mask") is not None):
            return forward(*args, **kwargs)
        cut = ids.shape[1] - keep + 1
        positions = kwargs.get("position_ids")
        first = forward(**{**kwargs, "input_ids": ids[:, :cut], "logits_to_keep": 1,
                           **({"position_ids": positions[:, :cut]} if positions is not None else {})})
        rest = forward(**{**kwargs, "input_ids": ids[:, cut:], "logits_to_keep": keep - 1, cache_key: kv.cache_of(first),
                          **({"position_ids": positions[:, cut:]} if positions is not None else {})})
        rest.logits = torch.cat([first.logits[:, -1:], rest.logits], dim=1)
        return rest

    return split
