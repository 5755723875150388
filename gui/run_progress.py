"""The settings panel's progress bar, as the jobs report it: tokens of a run, points of a sweep or compare, the
draft step's compile against its expected time, and how a job ended (done, stopped, failed)."""

from __future__ import annotations


class ProgressReport:
    """Mixin of `ControlPanel`: what its `progress` bar (a QProgressBar) shows."""

    def set_progress(self, value: int, maximum: int) -> None:
        self.progress.setRange(0, max(1, maximum))
        self.progress.setValue(min(value, maximum))
        self.progress.setFormat("%v / %m tokens")

    def set_finished(self, new_tokens: int, maximum: int, reason: str = "", stopped: bool = False) -> None:
        """A run ended: the bar is full (a run that ended at EOS or a stop string is done too, and says so); a
        run stopped by the user stays where it stopped."""
        self.progress.setRange(0, max(1, maximum))
        self.progress.setValue(min(new_tokens, maximum) if stopped else max(1, maximum))
        why = "" if new_tokens >= maximum and not stopped else \
            " · stopped" if stopped else " · ended at EOS" if reason == "EOS" else f" · ended by {reason}" if reason else ""
        self.progress.setFormat(f"{new_tokens} / {maximum} tokens{why}")

    def set_failed(self, what: str) -> None:
        """A job failed: the bar says so (the status bar and the dialog say why) instead of going blank."""
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat(what)

    def reset_progress(self) -> None:
        """Nothing on the bar: the settings changed since the last job, whose progress no longer applies."""
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("")

    def set_point(self, index: int, total: int) -> None:
        """Sweep / compare: point `index` (from 1) of `total` is being measured."""
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(index - 1)
        self.progress.setFormat(f"point {index} / {total}")

    def set_points_done(self, done: int, total: int) -> None:
        """Sweep / compare: `done` of `total` points are measured (the bar is full when the last one is)."""
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(min(done, total))
        self.progress.setFormat(f"{done} / {total} points done")

    def set_compiling(self, elapsed: float, expected: float | None) -> None:
        """The draft step is compiling: elapsed seconds against the expected time (the last compile's)."""
        if expected:
            self.progress.setRange(0, max(1, round(expected * 10)))
            self.progress.setValue(min(round(elapsed * 10), self.progress.maximum() - 1))
            left = max(0.0, expected - elapsed)
            more = f"~{left:.0f} s left" if left >= 1 else "taking longer than last time"
            self.progress.setFormat(f"compiling draft: {elapsed:.0f} s, {more}")
        else:
            self.progress.setRange(0, 0)
            self.progress.setFormat(f"compiling draft: {elapsed:.0f} s (first compile here, no estimate yet)")

