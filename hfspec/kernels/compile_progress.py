"""Progress while a draft's graph compiles (`Ticker`: "still compiling… N s" every `PROGRESS_EVERY` seconds) and
the compile workers ended once it is built (`end_compile_workers`): shared by the compiled step
(`hfspec.kernels.compiled`) and the compiled tree level (`hfspec.kernels.compiled_tree`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PROGRESS_EVERY = 5.0  # seconds between "still compiling" messages


class Ticker:
    """Calls `say("still compiling… N s")` every PROGRESS_EVERY seconds while the block runs, and says `scratch`
    once as soon as `from_scratch()` is true (inductor missed its cache: a real compile, which takes a while)."""

    POLL = 0.25  # seconds between looks at `from_scratch`

    def __init__(self, say: Callable[[str], None], began: float, from_scratch: Callable[[], bool] = lambda: False,
                 scratch: str = "", what: str = "the draft step"):
        self.say, self.began, self.done, self.what = say, began, threading.Event(), what
        self.from_scratch, self.scratch_message, self.scratch = from_scratch, scratch, False

    def _look(self) -> None:
        if not self.scratch and self.from_scratch():
            self.scratch = True
            self.say(self.scratch_message)

    def __enter__(self):
        def tick():
            last = time.perf_counter()
            while not self.done.wait(self.POLL):
                try:
                    self._look()
                    if time.perf_counter() - last >= PROGRESS_EVERY:
                        last = time.perf_counter()
                        self.say(f"still compiling {self.what}… {last - self.began:.0f} s")
                except Exception:  # noqa: BLE001 - a stop request cannot interrupt a compile; stop ticking
                    return
        self.thread = threading.Thread(target=tick, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        try:
            self._look()  # a compile quicker than one poll
        except Exception:  # noqa: BLE001 - as in tick
            pass
        return False


def end_compile_workers() -> None:
    """End inductor's compile worker processes once the step is built: left alive they hold memory and can take
    a core from the decoding that follows (on a small machine torch's OpenMP threads stall when another process
    runs). A later compile starts them again."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    except Exception:  # noqa: BLE001 - housekeeping only; the compiled step is built either way
        pass
