"""Turn logits into the distributions p and q with the processing the user asked for.

Both models' logits go through the same `LogitsProcessorList` (temperature, top-k, top-p, min-p,
repetition penalty, anything `generate` prepared), each position seeing its own token history.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

from hfspec.errors import HfspecError
from hfspec.sampling import scores_to_probs

# Warpers whose output depends only on the scores, never on the token history: safe to apply to many
# positions in one call.
_POSITION_FREE = tuple(
    getattr(lp, name)
    for name in ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                 "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")
    if hasattr(lp, name)
)


class Scorer:
    """Processes [B, k, V] logits that follow a [B, L] context into probabilities."""

    def __init__(self, processors: LogitsProcessorList | None, do_sample: bool, vocab_size: int):
        processors = list(processors or [])
        self.do_sample = do_sample
        self.vocab_size = vocab_size
        # Processors up to the last history-dependent one run position by position; the position-free rest
        # (usually the warpers) run once over all positions.
        last = max((i for i, proc in enumerate(processors) if not isinstance(proc, _POSITION_FREE)), default=-1)
        self.per_position, self.batched = processors[: last + 1], processors[last + 1 :]
        self.needs_history = bool(self.per_position)

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
        tokens = scores.argmax(-1)
        require_distributions(_best_is_finite(scores, tokens), scores, history)
        return tokens

    def scores(self, history: list | None, extra: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Processed scores [B, k, V] (the arguments of `probs`)."""
        scores = fit_vocab(logits.float(), self.vocab_size)
        batch, k, vocab = scores.shape
        if self.per_position:
            out = torch.empty_like(scores)
            for rows, ids in history:
                for j in range(k):
                    context = torch.cat([ids, extra[rows, :j]], dim=1)
                    out[rows, j] = _apply(self.per_position, context, scores[rows, j])
            scores = out
        if self.batched:
            scores = _apply(self.batched, extra, scores.reshape(batch * k, vocab)).reshape(batch, k, vocab)
        return scores


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
