"""Settings that persist between runs (QSettings, INI format).

The file is the platform's user settings location for organisation "hfspec", application "dashboard",
unless `$HFSPEC_GUI_SETTINGS` names an .ini file (tests use a temporary one; so can users).
"""

from __future__ import annotations

import json
import os

from PySide6.QtCore import QSettings

from hfspec.session import RunSettings

ORGANISATION = "hfspec"
APPLICATION = "dashboard"
ENV_VAR = "HFSPEC_GUI_SETTINGS"


def open_settings(path: str | os.PathLike | None = None) -> QSettings:
    """The QSettings store: `path` (an .ini file), else $HFSPEC_GUI_SETTINGS, else the user's location."""
    path = path or os.environ.get(ENV_VAR)
    if path:
        return QSettings(os.fspath(path), QSettings.Format.IniFormat)
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANISATION, APPLICATION)


def save_run_settings(store: QSettings, settings: RunSettings) -> None:
    store.setValue("run/settings", json.dumps(settings.to_dict()))


def load_run_settings(store: QSettings) -> RunSettings | None:
    text = store.value("run/settings")
    if not text:
        return None
    try:
        return RunSettings.from_dict(json.loads(str(text)))
    except (ValueError, TypeError):
        return None


def save_value(store: QSettings, key: str, value) -> None:
    store.setValue(key, json.dumps(value))


def load_value(store: QSettings, key: str, default=None):
    text = store.value(key)
    if text is None:
        return default
    try:
        return json.loads(str(text))
    except ValueError:
        return default


# The window's inputs kept between sessions, beside the run settings: key -> (view, its input).
INPUTS = (("sweep/gamma_from", "sweep", "gamma_from"), ("sweep/gamma_to", "sweep", "gamma_to"),
          ("sweep/repeats", "sweep", "repeats"), ("compare/repeats", "compare", "repeats"),
          ("sweep/drafts", "sweep", "drafts"), ("compare/items", "compare", "items"))


def restore_window(window) -> None:
    """Fill the window from its store: the run settings (else the default preset), geometry (else fitted to the
    screen), the Sweep and Compare tabs' inputs."""
    from PySide6.QtCore import QByteArray

    saved = load_run_settings(window.store)
    if saved is not None:
        window.controls.set_settings(saved)
    else:
        from hfspec.io.presets import DEFAULT_PRESET

        window.controls.choose_preset(DEFAULT_PRESET)
    geometry = window.store.value("window/geometry")
    if not (isinstance(geometry, QByteArray) and window.restoreGeometry(geometry)):
        window.fit_to_screen()
    for key, view, name in INPUTS:
        widget = getattr(getattr(window, view), name)
        _set(widget, load_value(window.store, key, _get(widget)))


def save_window(window) -> None:
    from hfspec.errors import HfspecError

    try:  # an invalid form is not persisted: the last valid settings stay
        save_run_settings(window.store, window.controls.settings().validated())
    except HfspecError:
        pass
    window.store.setValue("window/geometry", window.saveGeometry())
    for key, view, name in INPUTS:
        value = _get(getattr(getattr(window, view), name))
        if valid_input(key, value):  # else the last valid value stays
            save_value(window.store, key, value)
    window.store.sync()


def valid_input(key: str, value) -> bool:
    """Whether a kept input holds what its tab would accept: every draft of the Sweep and Compare tabs parses."""
    from hfspec.drafts import registry
    from hfspec.errors import HfspecError
    from hfspec.session import parse_list

    if key == "sweep/drafts":
        specs = parse_list(str(value))
    elif key == "compare/items":
        specs = [line.rpartition("|")[2].strip() for line in str(value).splitlines() if line.strip()]
    else:
        return True
    try:
        for spec in specs:
            registry.parse(spec)
    except HfspecError:
        return False
    return True


def _get(widget):
    for getter in ("value", "text", "toPlainText"):
        if hasattr(widget, getter):
            return getattr(widget, getter)()
    raise TypeError(type(widget).__name__)


def _set(widget, value) -> None:
    for setter in ("setValue", "setPlainText", "setText"):
        if hasattr(widget, setter):
            getattr(widget, setter)(value)
            return
    raise TypeError(type(widget).__name__)
