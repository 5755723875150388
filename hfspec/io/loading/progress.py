"""Load progress: lines to stderr or a callable, and transformers' tqdm bars turned into throttled lines."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Progress = bool | Callable[[str], Any] | None

_tls = threading.local()  # per-thread progress mode of the load in progress (None: no hfspec load)
_hook_lock = threading.Lock()
_hook_installed = False


class _CallbackBar:
    """Stands in for one of transformers' tqdm bars: forwards "desc: n/total" to a progress callable
    (at most about every 0.25 s, and at the end) instead of drawing on the terminal."""

    def __init__(self, bar, callback, args, kwargs):
        self._bar = bar
        self._callback = callback
        self._iterable = args[0] if args else kwargs.get("iterable")
        self.desc = kwargs.get("desc") or "loading"
        total = kwargs.get("total")
        if total is None and self._iterable is not None:
            try:
                total = len(self._iterable)
            except TypeError:
                total = None
        self.total = total
        self.n = 0
        self._last = 0.0

    def _tick(self, force=False):
        now = time.perf_counter()
        if force or now - self._last >= 0.25:
            self._last = now
            self._callback(f"{self.desc}: {self.n}/{self.total}" if self.total else f"{self.desc}: {self.n}")

    def __iter__(self):
        for item in self._iterable if self._iterable is not None else ():
            yield item
            self.n += 1
            self._tick(self.n == self.total)

    def update(self, n=1):
        self.n += n
        self._tick(self.total is not None and self.n >= self.total)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):  # set_postfix, refresh, ... -> the (disabled) real bar
        return getattr(self._bar, name)


def _install_tqdm_hook():
    """transformers creates its "Loading weights" bars through utils.logging.tqdm, which takes a hook. Ours
    only acts inside a hfspec load on the same thread (no global switch is flipped, so loads in worker
    threads do not disturb each other) and otherwise defers to any previous hook."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        try:
            from transformers.utils import logging as hf_logging

            setter = hf_logging.set_tqdm_hook
        except (ImportError, AttributeError):
            _hook_installed = True  # older transformers: bars follow their own global setting
            return
        previous = None

        def hook(factory, args, kwargs):
            mode = getattr(_tls, "progress", None)
            if mode is None or mode is True:
                return previous(factory, args, kwargs) if previous else factory(*args, **kwargs)
            bar = factory(*args, **{**kwargs, "disable": True})
            return _CallbackBar(bar, mode, args, kwargs) if callable(mode) else bar

        previous = setter(hook)
        _hook_installed = True


def report(progress: Progress, message: str):
    if progress is None or progress is False:
        return
    if callable(progress):
        progress(message)
    else:
        print(message, file=sys.stderr, flush=True)



@contextmanager
def reporting(progress: Progress) -> Iterator[None]:
    """Within: transformers' bars of this thread follow `progress` (lines to a callable, hidden, or drawn)."""
    _install_tqdm_hook()
    saved = getattr(_tls, "progress", None)
    _tls.progress = progress if callable(progress) else bool(progress)
    try:
        yield
    finally:
        _tls.progress = saved


def human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
