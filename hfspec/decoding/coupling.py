"""How draft and target are coupled when sampling: `coupling="rejection"` (the default, Leviathan et al.'s
accept/reject rule, `hfspec.decoding.sampling.verify`) or `coupling="gumbel"`, the draft-invariant mode.

Draft-invariant sampling (Gumbel-max coupling; Daliri, Musco and Suresh, 2024, "Coupling without communication
and drafter-invariant speculative decoding"): every new token position i of every batch row has its own noise
g_i, i.i.d. Gumbel(0, 1) over the vocabulary, a pure function of (seed, row, i), where row is the row's index in
the batch and i the token's index among the row's new tokens. The target's token at i is argmax(log p_i + g_i)
(the Gumbel-max trick: a draw from p_i, p_i processed as usual: temperature, top-k, top-p, ...). The draft
proposes argmax(log q_i + g_i) with the same g_i; a proposal is accepted iff it equals the target's token, and at
the first mismatch the target's token is emitted; after γ acceptances the bonus is the target's token at the next
position. The output is therefore plain Gumbel-max sampling of the target with that noise: distributed exactly as
the target's samples, and the same text for a seed whatever the draft, γ, early exit or timing (plain decoding
with `coupling="gumbel"` gives it too). The price: a proposal is accepted only when the two argmaxes agree,
which happens with probability ≤ Σ min(p, q) (the rejection rule's acceptance); see docs/measurement.md.

The noise is counter-based (SplitMix64 over (seed, row, position, token)), computed on the host in NumPy's
unsigned 64-bit arithmetic and moved to the scores' device: the same numbers on every machine and device, and
independent of how many draws were made before.
"""

from __future__ import annotations

import numpy as np
import torch

from hfspec.errors import bad_value

COUPLINGS = ("rejection", "gumbel")
COUPLING_ALLOWED = ('"rejection" (the default: accept with probability min(1, p/q), resample from the residual) '
                    'or "gumbel" (draft-invariant: the text for a seed is the same whatever the draft and γ)')

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_CHUNK = 1 << 22  # noise values made per NumPy pass (bounds the temporaries at ~100 MB)


def check_coupling(coupling) -> None:
    if not isinstance(coupling, str) or coupling not in COUPLINGS:
        raise bad_value("coupling", coupling, COUPLING_ALLOWED)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 arrays (wrapping arithmetic, as unsigned NumPy integers do)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def noise_keys(seed: int, rows, positions) -> np.ndarray:
    """uint64 keys [N] of (seed, rows[k], positions[k]): one SplitMix64 stream per row and position."""
    rows = np.asarray(rows, dtype=np.uint64)
    positions = np.asarray(positions, dtype=np.uint64)
    golden = np.uint64(_GOLDEN)
    with np.errstate(over="ignore"):
        z = _mix(np.full(rows.shape, (int(seed) & _MASK), dtype=np.uint64) + golden)
        z = _mix((z ^ rows) + golden)
        return _mix((z ^ positions) + golden)


def uniforms(keys: np.ndarray, vocab: int) -> np.ndarray:
    """float64 [N, vocab] in (0, 1): the first `vocab` outputs of SplitMix64 seeded with each key (53 bits each,
    centred in their interval, so never 0 or 1)."""
    steps = np.arange(1, vocab + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
    with np.errstate(over="ignore"):
        z = _mix(keys[:, None] + steps[None, :])
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def gumbel_noise(seed: int, rows, positions, vocab: int, device=None) -> torch.Tensor:
    """float64 [N, vocab] Gumbel(0, 1) noise for the (row, position) pairs, on `device`."""
    keys = noise_keys(seed, rows, positions)
    out = np.empty((keys.shape[0], vocab), dtype=np.float64)
    step = max(1, _CHUNK // max(1, vocab))
    for start in range(0, keys.shape[0], step):
        u = uniforms(keys[start : start + step], vocab)
        out[start : start + step] = -np.log(-np.log(u))
    return torch.from_numpy(out).to(device)


class GumbelNoise:
    """The noise of one seeded run: `at(rows, starts, count, vocab, device)` is [len(rows), count, vocab], the
    noise of batch row rows[b] at new-token positions starts[b] .. starts[b] + count − 1."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def at(self, rows, starts, count: int, vocab: int, device=None) -> torch.Tensor:
        rows = np.repeat(np.asarray(rows, dtype=np.int64), count)
        positions = (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(count)[None, :]).reshape(-1)
        noise = gumbel_noise(self.seed, rows, positions, vocab, device)
        return noise.view(-1, count, vocab)
