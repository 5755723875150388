"""The draft-step compile's progress with an estimated time: the worker's status lines say when a compile starts
and ends; a one-second timer counts in between against the last compile of the same pair (kept in the settings
store), or of any pair when this one never compiled here."""

from __future__ import annotations

import re
import time

from PySide6.QtCore import QObject, QTimer, Signal

STARTED = re.compile(r"^compiling the draft step\b")
ENDED = re.compile(r"^(compiled the draft step in (?P<seconds>[0-9.]+) s|draft step: compile failed)")


class CompileClock(QObject):
    tick = Signal(float, object)   # elapsed seconds, expected seconds (None: no earlier compile)
    ended = Signal(float)          # seconds the compile took

    def __init__(self, store, parent=None):
        super().__init__(parent)
        self.store = store
        self.key = ""
        self.began: float | None = None
        self.expected: float | None = None
        self.timer = QTimer(self)
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self._tick)

    def set_job(self, settings) -> None:
        """The pair that the next compile is for."""
        self.key = f"{settings.target}|{settings.draft}|{settings.dtype or 'default'}|{settings.device or 'default'}"

    def feed(self, message: str) -> None:
        """A status line from the worker."""
        if STARTED.match(message) and self.began is None:
            self.began = time.monotonic()
            self.expected = self.last_seconds()
            self.timer.start()
            self._tick()
        elif (m := ENDED.match(message)) and self.began is not None:
            seconds = float(m.group("seconds")) if m.group("seconds") else time.monotonic() - self.began
            if m.group("seconds"):
                self.store.setValue(f"compile/{self._safe(self.key)}", seconds)
                self.store.setValue("compile/last", seconds)
            self.stop()
            self.ended.emit(seconds)

    def stop(self) -> None:
        self.timer.stop()
        self.began = None

    def running(self) -> bool:
        return self.began is not None

    def last_seconds(self) -> float | None:
        for key in (f"compile/{self._safe(self.key)}", "compile/last"):
            value = self.store.value(key)
            try:
                if value is not None:
                    return float(value)
            except (TypeError, ValueError):
                continue
        return None

    def _tick(self) -> None:
        if self.began is not None:
            self.tick.emit(time.monotonic() - self.began, self.expected)

    @staticmethod
    def _safe(key: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", key)
