"""Prompt lookup: copy continuations of the last n-gram from the prompt and the text so far (no model).

    draft = make_draft(target, "lookup")       # or "lookup-n2": match suffixes of up to 2 tokens

Each round, for every row: the longest suffix of its tokens (up to N) that occurred earlier, at its most
recent such occurrence, and the γ tokens that followed it there (overlapping copy: a match near the end
repeats periodically, as in LZ77). The idea is A. Saxena, "Prompt Lookup Decoding" (2023,
github.com/apoorvumang/prompt-lookup-decoding), in transformers as `prompt_lookup_num_tokens`. The draft gives
no distribution (q is None): the loop treats q as one-hot on the proposal, so a token is accepted with
probability p(x) and sampling stays exact, whatever is proposed.

A batch proposes one count k for all rows: γ when any row found a match, else 0. A row without a match
proposes its last token repeated (still exact, only less likely accepted), so one row without a match does
not stop the others from copying.
"""

from __future__ import annotations

import copy
import re
import time

import numpy as np
import torch
from torch import nn

from hfspec.attrs import STEP_PATH, set_attr
from hfspec.drafts.base import Decide, Pick
from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.errors import bad_value
from hfspec.kernels.slots import Slots
from hfspec.validate import vocab_size

DEFAULT_NGRAM = 3
NGRAMS = (1, 8)
_SPEC = re.compile(r"lookup(?:-n(\d+))?")


class LookupDraft:
    """The `Draft` of prompt lookup. No forwards: `forwards` and `positions_fed` stay 0 (so the loop's stats
    record no draft time); `seconds` is the time spent searching, which the γ policy reads per round."""

    forwards, positions_fed = 0, 0

    def __init__(self, ngram: int = DEFAULT_NGRAM):
        self.ngram = ngram
        self.seconds = 0.0

    def propose(self, slots: Slots, gamma: int, pick: Pick, decide: Decide | None = None):
        if gamma <= 0:
            return slots.tokens.new_empty((slots.tokens.shape[0], 0)), None
        began = time.perf_counter()
        x = propose_tokens(slots.tokens, None if slots.all_valid else slots.valid, gamma, self.ngram)
        slots.append(x)
        self.seconds += time.perf_counter() - began
        return x, None

    def rollback(self, length: int) -> None:
        """Stateless: every round reads the slots afresh."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Stateless."""


def propose_tokens(tokens: torch.Tensor, valid: torch.Tensor | None, gamma: int, ngram: int) -> torch.Tensor:
    """[B, γ] proposals for tokens [B, S] (valid [B, S], None: all valid), or [B, 0] when no row has a match.

    The search runs in NumPy on the host (a few small array operations per round, cheaper than torch's per-op
    overhead at these sizes); the proposals come back on the tokens' device."""
    seq = tokens.detach().cpu().numpy()
    ok = None if valid is None else valid.detach().cpu().numpy().astype(bool)
    batch, size = seq.shape
    if ok is not None:  # move each row's valid tokens to the right, in order (left padding, holes)
        order = np.argsort(ok, axis=1, kind="stable")
        seq, ok = np.take_along_axis(seq, order, 1), np.take_along_axis(ok, order, 1)
    if size < 2:
        return tokens.new_empty((batch, 0))
    length = match_lengths(seq, ok, ngram)  # [B, S - 1]: suffix matched by the text ending at slot i
    best = (length * size + np.arange(size - 1)).argmax(axis=1)  # the longest match; of equals, the latest
    found = length[np.arange(batch), best] > 0
    if not found.any():
        return tokens.new_empty((batch, 0))
    start = best + 1  # the continuation starts after the match; it repeats with period size - start
    steps = np.arange(gamma)[None, :] % (size - start)[:, None]
    x = np.where(found[:, None], np.take_along_axis(seq, start[:, None] + steps, 1), seq[:, -1:])
    return torch.from_numpy(x).to(device=tokens.device, dtype=tokens.dtype)


def match_lengths(seq: np.ndarray, ok: np.ndarray | None, ngram: int) -> np.ndarray:
    """[B, S - 1]: for each slot i < S - 1, how many of the last tokens (up to `ngram`) the text ending at i
    shares with the text ending at S - 1. Slots that are not valid (`ok` False) never match."""
    batch, size = seq.shape
    same_last = seq[:, :-1] == seq[:, -1:]
    if ok is not None:
        same_last &= ok[:, :-1] & ok[:, -1:]
    rows, ends = np.nonzero(same_last)  # the candidates: only these can match longer
    run = np.ones(len(rows), dtype=bool)
    matched = np.ones(len(rows), dtype=np.int64)
    for k in range(1, ngram):  # compare the k-th token back of every candidate with the suffix's
        back = ends - k
        at = np.maximum(back, 0)
        run &= (back >= 0) & (seq[rows, at] == seq[rows, size - 1 - k])
        if ok is not None:
            run &= ok[rows, at] & ok[rows, size - 1 - k]
        if not run.any():
            break
        matched += run
    length = np.zeros((batch, size - 1), dtype=np.int64)
    length[rows, ends] = matched
    return length


class PromptLookup(nn.Module):
    """The draft model `make_draft(target, "lookup")` returns: no weights, the target's config (for code that
    reads `draft.config.vocab_size`), and its own `Draft` (`hfspec_draft`, the `DRAFT_HOOK` of `hfspec.attrs`). It
    has no forward."""

    def __init__(self, config, ngram: int = DEFAULT_NGRAM):
        super().__init__()
        self.config = config
        self.ngram = ngram
        set_attr(self, STEP_PATH, "prompt lookup (n-gram copy, no model forward)")

    def hfspec_draft(self, vocab: int | None = None) -> LookupDraft:
        return LookupDraft(self.ngram)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        raise bad_value("draft", "prompt lookup", "a draft model with a forward returning logits (prompt "
                        "lookup has none: it only proposes inside hfspec.generate)")


def _parse(text: str, low: str) -> DraftSpec | None:
    if not low.startswith("lookup"):
        return None
    match = _SPEC.fullmatch(low)
    if not match:
        raise fail(f"cannot read {text!r} (write lookup or lookup-nN, e.g. lookup-n2)")
    ngram = int(match.group(1)) if match.group(1) else DEFAULT_NGRAM
    if not NGRAMS[0] <= ngram <= NGRAMS[1]:
        raise fail(f"lookup n-gram must be {NGRAMS[0]}..{NGRAMS[1]}, got {ngram}")
    return DraftSpec("lookup", params=(("ngram", ngram),))


def _build(target, spec: DraftSpec, options: dict) -> PromptLookup:
    config = target.config
    width = vocab_size(target)
    if getattr(config, "vocab_size", None) != width:  # a padded head: the draft must read as the same width
        config = copy.copy(config)
        config.vocab_size = width
    return PromptLookup(config, int(spec.param("ngram", DEFAULT_NGRAM)))


def _spec_of(values: dict) -> str:
    ngram = values.get("ngram")
    try:
        ngram = DEFAULT_NGRAM if ngram is None else int(str(ngram).strip())
    except ValueError:
        raise fail(f"lookup n-gram must be an integer {NGRAMS[0]}..{NGRAMS[1]}, got {ngram!r}") from None
    return "lookup" if ngram == DEFAULT_NGRAM else f"lookup-n{ngram}"  # checked by parsing it


def _assisted(target, draft, spec: DraftSpec, gamma: int):
    ngram = int(spec.param("ngram", DEFAULT_NGRAM))
    return ({"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": ngram},
            f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={ngram}")


KIND = DraftKind(
    name="lookup", title="prompt lookup (n-gram copy)",
    allowed=f"lookup, lookup-n{NGRAMS[0]}..lookup-n{NGRAMS[1]}",
    parse=_parse, build=_build, label=lambda s: f"lookup-n{s.param('ngram', DEFAULT_NGRAM)}",
    fields=(Field("ngram", "longest n-gram", DEFAULT_NGRAM, low=NGRAMS[0], high=NGRAMS[1]),),
    spec_of=_spec_of, options=frozenset(), assisted=_assisted, examples=("lookup", "lookup-n2", "lookup-n5"),
)
LOOKUP = KIND
