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
