"""Live data of a run, safe to hand across threads: a snapshot after every target pass, a bounded queue of
them, the text of each new token, and the recorder that turns the engine's rounds into snapshots."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from hfspec.compat import old_names
from hfspec.decoding.round import RoundTree

ROLLING_WINDOW = 16  # target passes in the rolling acceptance rate


@old_names
@dataclass
class LiveSnapshot:
    """What a live view needs after one target pass (copied: safe to hand to another thread)."""

    round_index: int
    gamma: int
    accepted: int                 # draft tokens accepted this pass (row 0)
    checked: int                  # draft tokens checked this pass (all rows)
    committed: int                # tokens added this pass (all rows)
    alpha: float                  # cumulative acceptance rate
    rolling_alpha: float          # acceptance rate over the last ROLLING_WINDOW passes
    tokens_per_pass: float        # cumulative
    expected_tokens_per_pass: float  # (1 − α^(γ+1)) / (1 − α) with the cumulative α and mean γ
    predicted_speedup: float      # the cost model fitted to the run so far (SpecStats.predicted_speedup)
    measured_speedup: float | None  # tokens/s now over the cached baseline's tokens/s
    c: float                      # draft bytes / target bytes
    c_time: float                 # measured draft forward time / target forward time
    elapsed: float
    new_tokens: int
    accepted_by_position: list[int]
    checked_by_position: list[int]
    pieces: list[tuple[str, str]]  # (text, kind) of this pass's tokens, row 0
    tree: RoundTree | None = None  # a token tree's pass: the tree, its tokens' texts filled in (immutable)


class LiveBuffer:
    """A bounded, lock-protected queue of snapshots: the worker pushes every pass, the GUI drains at ~20 Hz."""

    def __init__(self, maxlen: int = 100_000):
        self._items: deque = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def push(self, item) -> None:
        with self._lock:
            self._items.append(item)

    def drain(self) -> list:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class IncrementalDecoder:
    """Turns generated ids into text pieces, one per token, decoding with the prompt as context (so spaces
    and multi-byte characters come out as the full decode shows them)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.text = self._decode(self.ids)

    def _decode(self, ids) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, ids: Iterable[int]) -> list[str]:
        pieces = []
        for token in ids:
            self.ids.append(int(token))
            text = self._decode(self.ids)
            common = len(self.text) if text.startswith(self.text) else _common_prefix(self.text, text)
            pieces.append(text[common:])
            self.text = text
        return pieces

    def piece(self, token: int) -> str:
        """One token's text on its own (not added to the text)."""
        return self._decode([int(token)])


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def series_row(s: LiveSnapshot) -> dict:
    """One target pass of the live series, for exports."""
    return {"pass": s.round_index + 1, "gamma": s.gamma, "accepted": s.accepted, "checked": s.checked,
            "committed": s.committed, "alpha": s.alpha, "rolling_alpha": s.rolling_alpha,
            "tokens_per_pass": s.tokens_per_pass, "expected_tokens_per_pass": s.expected_tokens_per_pass,
            "predicted_speedup": s.predicted_speedup, "c_time": s.c_time, "elapsed": s.elapsed,
            "new_tokens": s.new_tokens}




class LiveRecorder:
    """The `on_round` callback of a watched run: text pieces of row 0, a `LiveSnapshot` per target pass (to
    `on_live` and, as a row, to `series`)."""

    def __init__(self, decoder: IncrementalDecoder, on_live: Callable[[LiveSnapshot], None] | None = None):
        self.decoder = decoder
        self.on_live = on_live
        self.pieces: list[tuple[str, str]] = []
        self.series: list[dict] = []
        self._window: deque = deque(maxlen=ROLLING_WINDOW)
        self._last = {"checked": 0, "new": 0}
        self._start = time.perf_counter()

    def __call__(self, event) -> None:
        s = event.stats
        checked, committed = s.checked - self._last["checked"], s.new_tokens - self._last["new"]
        self._last.update(checked=s.checked, new=s.new_tokens)
        row0 = event.rows.index(0) if event.rows and 0 in event.rows else (0 if not event.rows else None)
        new = []
        if row0 is not None and row0 < len(event.new_tokens):
            new = list(zip(self.decoder.add(event.new_tokens[row0]), event.kinds[row0], strict=True))
            self.pieces.extend(new)
        accepted = sum(event.accepted)
        self._window.append((accepted, checked))
        win_checked = sum(k for _, k in self._window)
        snapshot = LiveSnapshot(
            round_index=event.round_index, gamma=int(event.gamma), accepted=accepted, checked=checked,
            committed=committed, alpha=s.alpha,
            rolling_alpha=sum(a for a, _ in self._window) / win_checked if win_checked else 0.0,
            tokens_per_pass=s.tokens_per_pass, expected_tokens_per_pass=s.expected_tokens_per_pass,
            predicted_speedup=s.predicted_speedup, measured_speedup=None, c=s.c_bytes, c_time=s.c_time,
            elapsed=time.perf_counter() - self._start, new_tokens=s.new_tokens,
            accepted_by_position=list(s.accepted_by_position),
            checked_by_position=list(s.checked_by_position), pieces=new, tree=self._tree(event.tree))
        self.series.append(series_row(snapshot))
        if self.on_live is not None:
            self.on_live(snapshot)

    def _tree(self, tree: RoundTree | None) -> RoundTree | None:
        """The round's tree with its tokens' texts (decoded only for a live display)."""
        if tree is None or self.on_live is None:
            return tree
        return replace(tree, texts=tuple(self.decoder.piece(t) for t in tree.tokens),
                       token_text=self.decoder.piece(tree.token))
