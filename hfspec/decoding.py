"""The speculative decoding loop; plain decoding is its γ = 0 case.

Batches use one shared slot layout for both models. Each row accepts its own number of draft tokens per
round; the round's new token of every row goes to the same slot (after the longest accepted run), and the
slots a row did not accept become holes: masked out of attention, skipped by position ids, never re-fed.
So every model call is one forward for the whole batch, caches are cropped (never rebuilt), and a batch of
one has no holes at all. Rows that finish are dropped from the batch and the caches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hfspec.kv_model import CachedModel
from hfspec.sampling import sample, verify
from hfspec.scoring import Scorer
from hfspec.stats import RoundEvent, SpecStats
from hfspec.stopping import Stopper


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    kinds: list[list[str]]
    stats: SpecStats


class _Slots:
    """Token, position and validity per slot, for the rows still running."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        self.tokens = input_ids
        self.valid = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).bool()
        self.positions = (self.valid.long().cumsum(-1) - 1).clamp_min(0)
        self.all_valid = bool(self.valid.all())

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def append(self, token: torch.Tensor) -> None:
        """Add one valid slot per row (a draft token)."""
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        self.valid = torch.cat([self.valid, torch.ones_like(token[:, None], dtype=torch.bool)], dim=1)
        self.positions = torch.cat([self.positions, self.positions[:, -1:] + 1], dim=1)

    def settle(self, start: int, x: torch.Tensor, n: torch.Tensor, token: torch.Tensor) -> None:
        """After a round from slot `start`: keep drafts x[:, :max n] (holes past each row's n), then `token`."""
        m = int(n.max()) if n.numel() else 0
        kept = torch.arange(m, device=n.device)[None, :] < n[:, None]
        base = self.positions[:, start - 1 : start]
        self.tokens = torch.cat([self.tokens[:, :start], x[:, :m], token[:, None]], dim=1)
        self.valid = torch.cat([self.valid[:, :start], kept, torch.ones_like(token[:, None], dtype=torch.bool)], dim=1)
        new_positions = torch.cat([base + kept.long().cumsum(-1), base + n[:, None] + 1], dim=1)
        self.positions = torch.cat([self.positions[:, :start], new_positions], dim=1)
        self.all_valid = self.all_valid and bool(kept.all())

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.tokens, self.valid, self.positions = self.tokens[rows], self.valid[rows], self.positions[rows]
        self.all_valid = bool(self.valid.all())


def decode(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scorer: Scorer,
    stopper: Stopper,
    policy,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    streamer=None,
    on_round=None,
    should_stop=None,
    draft_vocab: int | None = None,
    stats: SpecStats | None = None,
) -> DecodeResult:
    """Generate until every row stops. `draft=None` gives plain decoding (one token per target pass)."""
    began = time.perf_counter()
    batch, prompt_len = input_ids.shape
    stats = stats or SpecStats()
    stats.gamma, stats.batch_size = (policy.label if draft is not None else 0), batch
    slots = _Slots(input_ids, attention_mask)
    t_model = CachedModel(target)
    d_model = CachedModel(draft) if draft is not None else None
    out: list[list[int]] = [[] for _ in range(batch)]
    kinds: list[list[str]] = [[] for _ in range(batch)]
    active = list(range(batch))
    round_index = 0

    def history(row: int) -> torch.Tensor:
        return torch.cat([input_ids[row], input_ids.new_tensor(out[row])])

    while active:
        if should_stop is not None and should_stop():
            stats.stopped = True
            break
        room = max(stopper.budget(prompt_len + len(out[row])) for row in active)
        gamma = max(0, min(policy.next(), room - 1)) if d_model is not None else 0
        start = slots.size
        groups = _history_groups([history(r) for r in active], slots.tokens.device) if scorer.needs_history else None

        # Draft: γ tokens, one forward each (the first also catches up on slots the draft has not seen).
        d_seconds, d_forwards = (d_model.seconds, d_model.forwards) if d_model else (0.0, 0)
        q_steps, x_steps = [], []
        for j in range(gamma):
            logits = d_model.feed(slots.tokens, slots.positions, slots.valid, start + j, 1, slots.all_valid)
            logits = logits.to(input_ids.device).float()
            if draft_vocab is not None and draft_vocab < logits.shape[-1]:
                logits[..., draft_vocab:] = -float("inf")
            x_so_far = _stack(x_steps, slots.tokens)
            ctx = [(rows, torch.cat([ids, x_so_far[rows]], dim=1)) for rows, ids in groups] if groups else None
            q_j = scorer.probs(ctx, x_so_far, logits)[:, 0]
            x_j = sample(q_j, generator) if scorer.do_sample else q_j.argmax(-1)
            q_steps.append(q_j)
            x_steps.append(x_j)
            slots.append(x_j)
        x = _stack(x_steps, slots.tokens)

        # Target: one forward over everything it has not seen, distributions at γ + 1 positions.
        t_seconds = t_model.seconds
        logits = t_model.feed(slots.tokens, slots.positions, slots.valid, start + gamma, gamma + 1, slots.all_valid)
        p = scorer.probs(groups, x, logits.to(input_ids.device))
        q = torch.stack(q_steps, dim=1) if q_steps else p[:, :0]
        n, token = verify(p, q, x, generator)

        # Commit each row's tokens in order, stopping exactly where plain generate would.
        n_list, token_list, x_list = n.tolist(), token.tolist(), x.tolist()
        committed, finished, new_tokens, new_kinds = [], [], [], []
        for i, row in enumerate(active):
            accepted = n_list[i]
            tokens = x_list[i][:accepted] + [token_list[i]]
            last = "target" if gamma == 0 else ("bonus" if accepted == gamma else "resampled")
            keep, done = stopper.commit(prompt_len + len(out[row]), tokens, lambda row=row: history(row))
            out[row].extend(tokens[:keep])
            row_kinds = (["accepted"] * accepted + [last])[:keep]
            kinds[row].extend(row_kinds)
            committed.append(keep)
            finished.append(done)
            new_tokens.append(tokens[:keep])
            new_kinds.append(row_kinds)
        if streamer is not None and new_tokens[0]:
            streamer.put(input_ids.new_tensor(new_tokens[0]).cpu())
        checked = [min(a + 1, gamma) for a in n_list]
        stats.record_round(gamma, n_list, checked, committed, active)
        if d_model is not None:
            d_step = (d_model.seconds - d_seconds) / max(1, d_model.forwards - d_forwards)
            policy.update(gamma, sum(n_list), sum(checked), d_step, t_model.seconds - t_seconds)
        _copy_model_stats(stats, t_model, d_model, began)
        if on_round is not None:
            on_round(RoundEvent(round_index, gamma, n_list, new_tokens, new_kinds, stats, list(active)))
        round_index += 1

        # Roll both caches back to the accepted prefix and lay out the next round.
        slots.settle(start, x, n, token)
        t_model.rollback(slots.size - 1)
        if d_model is not None:
            d_model.rollback(slots.size - 1)
        if any(finished):
            rows = torch.tensor([i for i, done in enumerate(finished) if not done], device=input_ids.device)
            active = [row for row, done in zip(active, finished, strict=True) if not done]
            if active:
                slots.keep_rows(rows)
                t_model.keep_rows(rows)
                if d_model is not None:
                    d_model.keep_rows(rows)

    if streamer is not None:
        streamer.end()
    _copy_model_stats(stats, t_model, d_model, began)
    width = max(len(row) for row in out) if out else 0
    sequences = torch.full((batch, prompt_len + width), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    sequences[:, :prompt_len] = input_ids
    for row, tokens in enumerate(out):
        sequences[row, prompt_len : prompt_len + len(tokens)] = input_ids.new_tensor(tokens)
    return DecodeResult(sequences, kinds, stats)


def _stack(steps: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """[B, k] from k tensors of [B]; [B, 0] when there are none."""
    return torch.stack(steps, dim=1) if steps else like.new_empty((like.shape[0], 0))


def _history_groups(histories: list[torch.Tensor], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows grouped by history length: (row indices, [rows, length] ids). Rows of a batch advance by different
    amounts, and processors that read the length (min_new_tokens, ...) must see each row's own."""
    by_length: dict[int, list[int]] = {}
    for i, h in enumerate(histories):
        by_length.setdefault(h.shape[0], []).append(i)
    return [(torch.tensor(rows, device=device), torch.stack([histories[i] for i in rows]))
            for rows in by_length.values()]


def _copy_model_stats(stats: SpecStats, t_model: CachedModel, d_model: CachedModel | None, began: float) -> None:
    stats.time_target = t_model.seconds
    stats.positions_fed_target = t_model.positions_fed
    if d_model is not None:
        stats.time_draft = d_model.seconds
        stats.draft_forwards = d_model.forwards
        stats.positions_fed_draft = d_model.positions_fed
    stats.time_total = time.perf_counter() - began
