"""Light and dark colours that follow the system's colour scheme (Qt 6.5+: QStyleHints.colorScheme, and its
colorSchemeChanged signal). Views read `current()` when they draw and restyle themselves in `retheme`."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette


@dataclass(frozen=True)
class Theme:
    name: str
    plot_bg: str
    plot_fg: str
    card_bg: str
    card_border: str
    muted: str        # captions, notes
    spec: str         # the draft spec line
    error: str
    rough: str        # a measured figure from too few pairs
    stale_bg: str     # the banner over results of other settings


LIGHT = Theme("light", plot_bg="#ffffff", plot_fg="#222222", card_bg="#f4f6f8", card_border="#d8dde3",
              muted="#555555", spec="#222255", error="#aa0000", rough="#b35900", stale_bg="#fff3cd")
DARK = Theme("dark", plot_bg="#1e1f22", plot_fg="#dddddd", card_bg="#2b2d31", card_border="#4a4d53",
             muted="#a9adb3", spec="#aab4ff", error="#ff7070", rough="#ffae57", stale_bg="#4a3f1a")

_current = LIGHT


def current() -> Theme:
    return _current


def system_theme() -> Theme:
    """DARK when the system's colour scheme is dark (Qt 6.5+), else LIGHT."""
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    return DARK if scheme is not None and scheme() == Qt.ColorScheme.Dark else LIGHT


def apply(theme: Theme) -> None:
    """Make `theme` current: the application's palette (Fusion's dark palette for DARK) and pyqtgraph's
    defaults for new plots. Widgets already built restyle in their `retheme`."""
    global _current
    import pyqtgraph as pg

    _current = theme
    app = QGuiApplication.instance()
    if app is not None and hasattr(app, "setStyle"):
        app.setPalette(dark_palette() if theme is DARK else app.style().standardPalette())
    pg.setConfigOptions(antialias=True, background=theme.plot_bg, foreground=theme.plot_fg)


def dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d31"), QColor("#e6e6e6")
    for role, colour in ((QPalette.ColorRole.Window, window), (QPalette.ColorRole.WindowText, text),
                         (QPalette.ColorRole.Base, base), (QPalette.ColorRole.AlternateBase, window),
                         (QPalette.ColorRole.ToolTipBase, window), (QPalette.ColorRole.ToolTipText, text),
                         (QPalette.ColorRole.Text, text), (QPalette.ColorRole.Button, window),
                         (QPalette.ColorRole.ButtonText, text), (QPalette.ColorRole.BrightText, QColor("#ff5555")),
                         (QPalette.ColorRole.Highlight, QColor("#3d6fb4")),
                         (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
                         (QPalette.ColorRole.PlaceholderText, QColor("#8a8d92")),
                         (QPalette.ColorRole.Link, QColor("#7aa7ff"))):
        p.setColor(role, colour)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#7c7f85"))
    return p
