"""Turn logits into the distributions p and q with the processing the user asked for.

Both models' logits go through the same `LogitsProcessorList` (temperature, top-k, top-p, min-p,
repetition penalty, anything `generate` prepared), each position seeing its own token history.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

from hfspec.decoding.sampling import first_argmax, gumbel_argmax, kth_largest, scores_to_probs
from hfspec.errors import HfspecError

# Warpers whose output depends only on the scores, never on the token history: safe to apply to many
# positions in one call.
_POSITION_FREE = tuple(
    getattr(lp, name)
    for name in ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                 "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")
    if hasattr(lp, name)
)
# Processors whose output depends on the history only through its length: "while the text is shorter than a
# limit, EOS gets −inf". Applied to every position at once with a write to the EOS columns only (their own
# `__call__` builds a vocabulary-wide mask with `torch.isin` per call: ~3 ms at 262k tokens).
_LENGTH_ONLY = tuple(
    getattr(lp, name)
    for name in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor")
    if hasattr(lp, name)
)


class Scorer:
    """Processes [B, k, V] logits that follow a [B, L] context into probabilities."""

    def __init__(self, processors: LogitsProcessorList | None, do_sample: bool, vocab_size: int):
        processors = [_FastTopK.of(proc) for proc in processors or []]
        self.do_sample = do_sample
        self.vocab_size = vocab_size
        # Processors up to the last history-dependent one run position by position; the position-free rest
        # (usually the warpers) run once over all positions.
        last = max((i for i, proc in enumerate(processors) if not isinstance(proc, _POSITION_FREE)), default=-1)
        self.per_position, self.batched = processors[: last + 1], processors[last + 1 :]
        self.needs_history = bool(self.per_position)
        self._steps = _steps(self.per_position, vocab_size)

    def probs(self, history: list | None, extra: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Distributions for positions following each row's history + extra[:, :j], j = 0..k-1.

        history: (rows, ids) groups of rows with equally long histories (only read when a processor needs
        it: length-dependent processors such as min_new_tokens must see each row's own length),
        extra: [B, ≥k-1] tokens, logits: [B, k, V'] raw logits (V' is padded or cut to the target's V).
        """
        scores = self.scores(history, extra, logits)
        probs = scores_to_probs(scores, self.do_sample)
        if self.do_sample:  # NaN and +inf scores, and rows all −inf, give NaN sums; one reduction finds them
            require_distributions(probs.sum(-1) > 0, scores, history)
        else:
            require_distributions(_best_is_finite(scores, scores.argmax(-1)), scores, history)
        return probs

    def greedy(self, history: list | None, extra: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """argmax tokens [B, k] of the processed scores (what `probs` puts all its mass on when greedy)."""
        if not self.per_position and not self.batched and logits.shape[-1] <= self.vocab_size:
            scores = logits  # nothing to process: skip the float copy
        else:
            scores = self.scores(history, extra, logits)
        tokens = first_argmax(scores)
        require_distributions(_best_is_finite(scores, tokens), scores, history)
        return tokens

    def gumbel(self, history: list | None, extra: torch.Tensor, logits: torch.Tensor, noise: torch.Tensor,
               with_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens [B, k] argmax(processed scores + noise) (`coupling="gumbel"`, `hfspec.decoding.coupling`; noise [B, k, V]
        Gumbel), and with `with_probs` the distributions [B, k, V] they are draws from (what `probs` returns)."""
        scores = self.scores(history, extra, logits)
        if with_probs:
            probs = scores_to_probs(scores, True)
            require_distributions(probs.sum(-1) > 0, scores, history)
        else:  # the largest score must be finite: no NaN, no +inf, not every token at −inf (as `probs` requires)
            probs = None
            require_distributions(scores.amax(-1).isfinite(), scores, history)
        return gumbel_argmax(scores, noise), probs

    def scores(self, history: list | None, extra: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Processed scores [B, k, V] (the arguments of `probs`)."""
        scores = fit_vocab(logits.float(), self.vocab_size)
        batch, k, vocab = scores.shape
        for kind, items in self._steps:
            if kind == "context":
                scores = _by_position(items, history, extra, scores)
            elif kind == "length":
                scores = _forbid_eos_while_short(items, history, scores)
            else:
                scores = _apply(items, extra, scores.reshape(batch * k, vocab)).reshape(batch, k, vocab)
        if self.batched:
            scores = _apply(self.batched, extra, scores.reshape(batch * k, vocab)).reshape(batch, k, vocab)
        return scores


class _FastTopK(lp.TopKLogitsWarper):
    """transformers' `TopKLogitsWarper` (scores below the k-th largest become `filter_value`), the same values,
    with the k-th largest found by `kth_largest` (~5× faster than torch.topk over a 262k vocabulary)."""

    @classmethod
    def of(cls, proc):
        if type(proc) is not lp.TopKLogitsWarper:
            return proc
        return cls(proc.top_k, proc.filter_value, proc.min_tokens_to_keep)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        shape = scores.shape
        flat = scores.reshape(-1, shape[-1])
        kth = kth_largest(flat, min(self.top_k, shape[-1]))
        return torch.where(flat < kth, self.filter_value, flat).view(shape)


def _steps(processors: list, vocab: int) -> list[tuple[str, list]]:
    """The per-position processors as runs of one kind, in order: "context" (each position sees its own
    history), "length" ((limit, EOS ids) of length-only processors) and "free" (position-free, all at once)."""
    steps: list[tuple[str, list]] = []
    for proc in processors:
        if type(proc) in _LENGTH_ONLY:
            limit = (proc.min_new_tokens + proc.prompt_length_to_skip if hasattr(proc, "min_new_tokens")
                     else proc.min_length)
            eos = torch.as_tensor(proc.eos_token_id).flatten().long()
            kind, item = "length", (limit, eos[(eos >= 0) & (eos < vocab)])  # as torch.isin: others match nothing
        else:
            kind, item = ("free" if isinstance(proc, _POSITION_FREE) else "context"), proc
        if steps and steps[-1][0] == kind:
            steps[-1][1].append(item)
        else:
            steps.append((kind, [item]))
    return steps


def _by_position(processors: list, history: list, extra: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Apply history-dependent processors position by position, each seeing its row's history + extra[:, :j]."""
    out = torch.empty_like(scores)
    for rows, ids in history:
        for j in range(scores.shape[1]):
            context = torch.cat([ids, extra[rows, :j]], dim=1)
            out[rows, j] = _apply(processors, context, scores[rows, j])
    return out


def _forbid_eos_while_short(limits: list, history: list, scores: torch.Tensor) -> torch.Tensor:
    """What `MinLengthLogitsProcessor` / `MinNewTokensLengthLogitsProcessor` do (EOS scores −inf while the
    context is shorter than the limit), for every position at once: the context at position j is L + j long,
    so a prefix of positions is short. Writes only the EOS columns, into one copy, and only when needed."""
    out = None
    k = scores.shape[1]
    active = [(limit, eos) for limit, eos in limits if eos.numel()]
    if active and len(history) == 1 and history[0][0].numel() == scores.shape[0]:
        length = history[0][1].shape[1]  # one group holding every row
        if all(limit - length >= k for limit, _ in active):  # every position short: one filled copy, no scatter
            return scores.index_fill(-1, torch.cat([eos for _, eos in active]).to(scores.device), -float("inf"))
    for rows, ids in history:
        for limit, eos in limits:
            short = min(k, limit - ids.shape[1])  # positions j < limit − L are short
            if short <= 0 or not eos.numel():
                continue
            out = scores.clone() if out is None else out
            where = (rows.to(scores.device)[:, None, None], torch.arange(short, device=scores.device)[None, :, None],
                     eos.to(scores.device)[None, None])
            out[where] = -float("inf")
    return scores if out is None else out


def _best_is_finite(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B, k] True where the argmax score is a number above −inf (argmax lands on a NaN when there is one)."""
    best = scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return best > -float("inf")


def require_distributions(ok: torch.Tensor, scores: torch.Tensor, history: list | None) -> None:
    """HfspecError naming the first row and position whose processed scores give no distribution
    (NaN, +inf, or every token at −inf): sampling from it would silently return a fixed token."""
    if bool(ok.all()):
        return
    row, j = (int(i) for i in (~ok).nonzero()[0])
    bad = scores[row, j]
    what = "NaN" if bool(bad.isnan().any()) else "+inf" if bool(bad.isposinf().any()) else "-inf for every token"
    length = next((ids.shape[1] for rows, ids in history or [] if bool((rows == row).any())), None)
    where = f"sequence position {length + j}" if length is not None else f"new-token offset {j} of this step"
    raise HfspecError(
        f"logits_processor: the next-token scores of batch row {row} at {where} are {what} after the logits "
        "processors, so there is no distribution to draw from; allowed: scores without NaN or +inf and with at "
        "least one token above -inf (check custom logits processors, bad_words_ids / suppress_tokens, and the "
        "model's dtype)"
    )


def _apply(processors: list, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Call each processor in order (what LogitsProcessorList does, without its per-call signature lookup)."""
    for proc in processors:
        scores = proc(input_ids, scores)
    return scores


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Cut or pad (with −inf) the last dimension to the target's vocabulary: extra draft rows are never drawn."""
    width = logits.shape[-1]
    if width == vocab_size:
        return logits
    if width > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - width), -float("inf"))
    return torch.cat([logits, pad], dim=-1)
