"""Named, ready-to-run demo configurations (``presets/*.toml``).

    from hfspec.io.presets import list_presets
    from hfspec.settings import load_preset
    list_presets()                       # ['gpt2-large-gpt2', 'micro-nano', 'micro-rtn3', 'micro-rtn4', ...]
    p = load_preset("micro-rtn4")        # a name, or the path of a .toml file
    target, draft, tokenizer = p.build()

This module finds and reads preset files, checks their keys and resolves their folders; `hfspec.settings` turns
them into a `Preset` (`RunSettings` from a file, whose fields `RunSettings.validated` checks as every run's are).

A preset file is a flat TOML table::

    description = "Embedded 1.8M micro model, 4-bit RTN copy of itself as draft"
    target = "models/micro"      # folder (relative to the .toml file's folder) or hub id
    draft = "rtn4"               # as hfspec.make_draft takes it (hfspec.drafts.registry): rtnB[-gN], bnb-…, folder, hub id
    gamma = 4                    # integer >= 1, or "auto"
    temperature = 1.0
    top_k = 0                    # 0: off
    top_p = 1.0                  # 1.0: off
    max_new_tokens = 64
    seed = 1
    prompt = "Return the"
    chat = false                 # optional: wrap the prompt in the tokenizer's chat template
    ignore_eos = false           # optional: always generate max_new_tokens tokens (EOS suppressed until then)
    tree = 0                     # optional: 0 or 1 the chain, 2..8 sibling leaves, "auto" a token tree
    coupling = "rejection"       # optional: or "gumbel" (draft-invariant sampling; no tree)
    needs_download = false       # true when target or draft come from the Hugging Face hub

The presets folder is ``$HFSPEC_PRESETS`` when set, else ``presets/`` of the source checkout, else
``<prefix>/share/hfspec/presets`` of an installed copy.  The default preset is :data:`DEFAULT_PRESET`.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.io.loading.sources import check_name_lengths

try:  # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10: tomli when installed, else the flat-table reader below
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None

__all__ = [
    "DEFAULT_PRESET",
    "list_presets",
    "preset_values",
    "read_preset",
    "resolve_sources",
    "registered_kind",
    "preset_path",
    "presets_dir",
]

DEFAULT_PRESET = "micro-rtn4"
ENV_VAR = "HFSPEC_PRESETS"

# key -> its default; REQUIRED when it must be present. The run's fields are RunSettings' (`RUN_KEYS`).
REQUIRED = object()
_FIELDS: dict[str, Any] = {
    "description": "",
    "target": REQUIRED,
    "draft": REQUIRED,
    "gamma": 4,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "max_new_tokens": 64,
    "seed": 1,
    "prompt": REQUIRED,
    "chat": False,
    "ignore_eos": False,
    "tree": 0,
    "coupling": "rejection",
    "needs_download": REQUIRED,
}
_FILE_TYPES = {"description": str, "needs_download": bool}  # the keys that are the file's, not the run's
ALLOWED_KEYS = tuple(_FIELDS)
RUN_KEYS = tuple(k for k in _FIELDS if k not in _FILE_TYPES)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


# ---------------------------------------------------------------------------------------------- locating
def presets_dir() -> Path:
    """The folder holding the shipped ``*.toml`` presets and ``models/``."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise HfspecError(f"{ENV_VAR}: folder {env!r} not found; allowed: a folder holding preset .toml files")
        return path.resolve()
    for cand in _candidates():
        if cand.is_dir() and any(cand.glob("*.toml")):
            return cand.resolve()
    raise HfspecError(
        "presets: no presets folder found (looked in "
        + ", ".join(str(c) for c in _candidates())
        + f"); allowed: set {ENV_VAR} to a folder of preset .toml files"
    )


def _candidates() -> list[Path]:
    out = [Path(__file__).resolve().parents[2] / "presets"]  # source checkout / editable install
    try:
        user = sysconfig.get_path("data", sysconfig.get_preferred_scheme("user"))  # pip install --user
    except (KeyError, AttributeError):
        user = None
    for base in (sysconfig.get_path("data"), sys.prefix, user):
        if base:
            cand = Path(base) / "share" / "hfspec" / "presets"  # pip install . (data-files)
            if cand not in out:
                out.append(cand)
    return out


def list_presets() -> list[str]:
    """Names of the presets in :func:`presets_dir`, sorted."""
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def preset_path(name_or_path) -> Path:
    """The .toml file for a preset name or path."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise HfspecError(f"preset: got {name_or_path!r}; allowed: a preset name or a path to a .toml file")
    text = name_or_path.strip()
    looks_like_path = text.endswith(".toml") or os.sep in text or "/" in text
    if looks_like_path:
        check_name_lengths(text, "preset", "a preset name or a .toml file path")
        path = Path(text).expanduser()
        if not path.is_file():
            raise HfspecError(f"preset: file {text!r} not found; allowed: an existing .toml file or a preset name "
                              f"({', '.join(_safe_list())})")
        return path.resolve()
    path = presets_dir() / f"{text}.toml"
    if not path.is_file():
        raise HfspecError(f"preset: unknown preset {text!r}; allowed: {', '.join(_safe_list())}, or a path to a "
                          ".toml file")
    return path


def _safe_list() -> list[str]:
    try:
        return list_presets()
    except HfspecError:
        return []


def registered_kind(spec: str):
    """The registry's kind of a draft spec that names no model (a `DraftKind`); None for a folder or hub id
    (resolved against the preset's folder). A malformed spec of a kind raises HfspecError."""
    text = spec.strip()
    for kind in registry.choices():
        if not kind.names_model and kind.parse(text, text.lower()) is not None:
            return kind
    return None


# ------------------------------------------------------------------------------------------------ reading
def read_preset(name_or_path) -> tuple[dict, Path]:
    """The raw table of a preset file (a name from :func:`list_presets` or a path to a .toml file) and its path."""
    path = preset_path(name_or_path)
    return _read_toml(path), path


def preset_values(data: dict, *, name: str = "custom") -> dict[str, Any]:
    """A preset given as a dict, its keys checked: every key known, the required ones present, the others filled
    with their defaults, and the file's own keys (description, needs_download) of their type. The run's fields
    (`RUN_KEYS`) are checked by `hfspec.settings.RunSettings.validated`, as every run's are; `resolve_sources`
    then resolves the folders."""
    where = f"preset {name}"
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise HfspecError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"allowed keys: {', '.join(ALLOWED_KEYS)}")
    values: dict[str, Any] = {}
    for key, default in _FIELDS.items():
        if key not in data:
            if default is REQUIRED:
                raise HfspecError(f"{where}: missing required key {key!r} "
                                  f"(required: {', '.join(k for k, v in _FIELDS.items() if v is REQUIRED)})")
            values[key] = default
            continue
        values[key] = data[key]
    for key, kind in _FILE_TYPES.items():
        value = values[key]
        if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
            raise HfspecError(f"{where}: {key} = {value!r} has type {type(value).__name__}; allowed: {kind.__name__}")
    return values


def resolve_sources(values: dict, *, name: str = "custom", base: Path | None = None) -> dict[str, str]:
    """A checked preset's target and draft, resolved: local folders (relative to ``base``, default cwd) as
    absolute paths, hub ids (with needs_download = true) and draft specs as written."""
    where = f"preset {name}"
    base = Path(base) if base is not None else Path.cwd()
    target = _resolve_model(where, "target", values["target"], base, values["needs_download"])
    draft = _resolve_draft(where, values["draft"], base, values["needs_download"])
    if not values["needs_download"] and not Path(target).is_dir():
        raise HfspecError(f"{where}: needs_download = false but target {target!r} is not a local "
                          "folder; allowed: needs_download = true for hub models")
    return {"target": target, "draft": draft}


def _is_pathish(text: str) -> bool:
    return text.startswith((".", "/", "~")) or os.sep in text and not _HUB_ID.fullmatch(text)


def _resolve_model(where: str, key: str, value: str, base: Path, needs_download: bool) -> str:
    """Local folder (relative to the preset's folder) -> absolute path; else a hub id."""
    text = value.strip()
    check_name_lengths(text, f"{where}: {key}")  # else the OS's "File name too long" from is_dir()
    local = (base / Path(text).expanduser()).resolve()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise HfspecError(f"{where}: {key} folder {str(local)!r} has no config.json; allowed: a Hugging Face "
                              "model folder or a hub id")
        return str(local)
    if not needs_download or _is_pathish(text):
        raise HfspecError(f"{where}: {key} folder {text!r} not found (looked in {str(local)!r}); allowed: an "
                          "existing model folder, relative to the preset file, or a hub id with needs_download = true")
    if not _HUB_ID.fullmatch(text):
        raise HfspecError(f"{where}: {key} = {text!r} is neither a folder nor a hub id; allowed: a model folder "
                          "or a hub id like 'owner/name'")
    return text


def _resolve_draft(where: str, value: str, base: Path, needs_download: bool) -> str:
    text = value.strip()
    try:
        kind = registered_kind(text)
    except HfspecError as exc:
        raise HfspecError(f"{where}: {exc}") from exc
    if kind is not None:
        return text.lower()
    return _resolve_model(where, "draft", text, base, needs_download)


# ---------------------------------------------------------------------------------------------------- TOML
def _read_toml(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    if _toml is not None:
        try:
            return _toml.loads(text)
        except _toml.TOMLDecodeError as exc:
            raise HfspecError(f"preset {path.name}: not valid TOML ({exc})") from exc
    return _flat_toml(text, path.name)


_LINE = re.compile(r"""\s*([A-Za-z0-9_-]+)\s*=\s*(.+?)\s*(?:#[^"']*)?$""")


def _flat_toml(text: str, where: str) -> dict:
    """A reader for flat ``key = value`` TOML (strings, ints, floats, booleans), enough for presets."""
    import ast

    out: dict = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if not m:
            raise HfspecError(f"preset {where}: not valid TOML (line {n}: {line.strip()!r})")
        key, raw = m.groups()
        if raw in ("true", "false"):
            out[key] = raw == "true"
            continue
        try:
            value = ast.literal_eval(raw.replace("_", "") if raw[0] not in "\"'" else raw)
        except (ValueError, SyntaxError):
            raise HfspecError(f"preset {where}: not valid TOML (line {n}: {line.strip()!r})") from None
        if not isinstance(value, str | int | float):
            raise HfspecError(f"preset {where}: not valid TOML (line {n}: {line.strip()!r})")
        out[key] = value
    return out
