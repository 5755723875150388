"""The speculative decoding loop; plain decoding is the same loop with a draft that proposes nothing.

Each round: the draft proposes up to γ tokens (`Draft.propose`), the target scores all of them in one forward,
`verify` keeps a prefix and draws one more token, both models roll back to what was kept. Batches share one
slot layout (see `hfspec.slots`); rows that finish are dropped from the batch and the caches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hfspec.drafts.base import Draft, NoDraft
from hfspec.kv_model import CachedModel
from hfspec.sampling import sample, verify, verify_greedy
from hfspec.scoring import Scorer
from hfspec.slots import Slots
from hfspec.stats import RoundEvent, SpecStats
from hfspec.stopping import Stopper


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    kinds: list[list[str]]
    stats: SpecStats


def decode(
    target: torch.nn.Module,
    draft: Draft | None,
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
    stats: SpecStats | None = None,
    target_runner=None,
) -> DecodeResult:
    """Generate until every row stops. `draft`: a `Draft` (see `hfspec.drafts.base`); None decodes plainly."""
    began = time.perf_counter()
    draft = draft if draft is not None else NoDraft()
    speculative = not isinstance(draft, NoDraft)
    batch, prompt_len = input_ids.shape
    stats = stats or SpecStats()
    stats.gamma, stats.batch_size = (policy.label if speculative else 0), batch
    stats.stop_reasons = [""] * batch
    slots = Slots(input_ids, attention_mask)
    t_model = target_runner or CachedModel(target)
    out: list[list[int]] = [[] for _ in range(batch)]
    kinds: list[list[str]] = [[] for _ in range(batch)]
    active = list(range(batch))
    device = input_ids.device
    round_index = 0

    def history(row: int) -> torch.Tensor:
        return torch.cat([input_ids[row], input_ids.new_tensor(out[row])])

    while active:
        if should_stop is not None and should_stop():
            stats.stopped = True
            for row in active:
                stats.stop_reasons[row] = "user"
            break
        room = max(stopper.budget(prompt_len + len(out[row])) for row in active)
        gamma = max(0, min(policy.next(), room - 1)) if speculative else 0
        start = slots.size
        groups = _history_groups([history(r) for r in active], device) if scorer.needs_history else None

        def pick(logits: torch.Tensor, x_so_far: torch.Tensor, groups=groups):
            """The draft's next token and its distribution q, processed exactly as the target's p will be."""
            logits = logits.to(device)
            ctx = [(rows, torch.cat([ids, x_so_far[rows]], dim=1)) for rows, ids in groups] if groups else None
            if not scorer.do_sample:
                return scorer.greedy(ctx, x_so_far, logits)[:, 0], None
            q_j = scorer.probs(ctx, x_so_far, logits)[:, 0]
            return sample(q_j, generator), q_j

        d_seconds, d_forwards = draft.seconds, draft.forwards
        x, q = draft.propose(slots, gamma, pick)
        asked, gamma = gamma, x.shape[1]  # a draft may propose fewer

        # Target: one forward over everything it has not seen, distributions at γ + 1 positions.
        t_seconds = t_model.seconds
        logits = t_model.feed(slots.tokens, slots.positions, slots.valid, start + gamma, gamma + 1, slots.all_valid)
        logits = logits.to(device)
        if scorer.do_sample:
            # q None: a draft without distributions proposes deterministically (q one-hot on x; `verify` forms
            # it only at the one position per row that needs it)
            n, token = verify(scorer.probs(groups, x, logits), q, x, generator)
        else:
            n, token = verify_greedy(scorer.greedy(groups, x, logits), x)

        # Commit each row's tokens in order, stopping exactly where plain generate would.
        n_list, token_list, x_list = n.tolist(), token.tolist(), x.tolist()
        committed, finished, new_tokens, new_kinds, accepted, checked = [], [], [], [], [], []
        for i, row in enumerate(active):
            n_i = n_list[i]
            tokens = x_list[i][:n_i] + [token_list[i]]
            last = "target" if gamma == 0 else ("bonus" if n_i == gamma else "resampled")
            keep, done, reason = stopper.commit(prompt_len + len(out[row]), tokens, lambda row=row: history(row))
            out[row].extend(tokens[:keep])
            row_kinds = (["accepted"] * n_i + [last])[:keep]
            kinds[row].extend(row_kinds)
            committed.append(keep)
            finished.append(done)
            new_tokens.append(tokens[:keep])
            new_kinds.append(row_kinds)
            # Positions past a stop (EOS, length) were never really used: count only those up to it.
            accepted.append(min(n_i, keep))
            checked.append(min(n_i + 1, gamma, keep))
            if done:
                stats.stop_reasons[row] = reason
        if streamer is not None and new_tokens[0]:
            streamer.put(input_ids.new_tensor(new_tokens[0]).cpu())
        stats.record_round(gamma, accepted, checked, committed, active)
        # A round where the draft had nothing to propose (prompt lookup without a match) says nothing about
        # α or c, and is not the policy choosing plain decoding: the policy does not learn from it.
        if speculative and not (asked > 0 and gamma == 0):
            d_step = (draft.seconds - d_seconds) / max(1, draft.forwards - d_forwards)
            policy.update(gamma, sum(accepted), sum(checked), d_step, t_model.seconds - t_seconds)
        _copy_model_stats(stats, t_model, draft, began)
        if on_round is not None:
            on_round(RoundEvent(round_index, gamma, accepted, new_tokens, new_kinds, stats, list(active)))
        round_index += 1

        # Roll both caches back to the accepted prefix and lay out the next round.
        slots.settle(start, x, n, token)
        t_model.rollback(slots.size - 1)
        draft.rollback(slots.size - 1)
        if any(finished):
            rows = torch.tensor([i for i, done in enumerate(finished) if not done], device=device)
            active = [row for row, done in zip(active, finished, strict=True) if not done]
            if active:
                slots.keep_rows(rows)
                t_model.keep_rows(rows)
                draft.keep_rows(rows)

    if streamer is not None:
        streamer.end()
    _copy_model_stats(stats, t_model, draft, began)
    width = max(len(row) for row in out) if out else 0
    sequences = torch.full((batch, prompt_len + width), pad_token_id, dtype=input_ids.dtype, device=device)
    sequences[:, :prompt_len] = input_ids
    for row, tokens in enumerate(out):
        sequences[row, prompt_len : prompt_len + len(tokens)] = input_ids.new_tensor(tokens)
    return DecodeResult(sequences, kinds, stats)



def _history_groups(histories: list[torch.Tensor], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows grouped by history length: (row indices, [rows, length] ids). Rows of a batch advance by different
    amounts, and processors that read the length (min_new_tokens, ...) must see each row's own."""
    by_length: dict[int, list[int]] = {}
    for i, h in enumerate(histories):
        by_length.setdefault(h.shape[0], []).append(i)
    return [(torch.tensor(rows, device=device), torch.stack([histories[i] for i in rows]))
            for rows in by_length.values()]


def _copy_model_stats(stats: SpecStats, t_model, draft: Draft, began: float) -> None:
    stats.time_target = t_model.seconds
    stats.positions_fed_target = t_model.positions_fed
    if draft.forwards:
        stats.time_draft = draft.seconds
        stats.draft_forwards = draft.forwards
        stats.positions_fed_draft = draft.positions_fed
    stats.time_total = time.perf_counter() - began
