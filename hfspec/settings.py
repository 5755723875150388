"""`RunSettings`, the one description of a run (the CLI, the dashboard and presets fill it); `Preset`, `RunSettings`
read from a preset file plus the file's own keys (`hfspec.io.presets` finds the files, checks their keys and
resolves their folders); and the draft form helpers that turn a kind and its values into a spec string and back."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hfspec.decoding.coupling import check_coupling
from hfspec.drafts import make_draft, registry
from hfspec.errors import HfspecError, bad_value
from hfspec.io.loading import load_model, load_tokenizer, parse_device, parse_dtype
from hfspec.io.loading.sources import check_name_lengths
from hfspec.io.presets import (
    ALLOWED_KEYS,
    RUN_KEYS,
    preset_values,
    read_preset,
    registered_kind,
    resolve_sources,
)
from hfspec.validate import (
    check_count,
    check_flag,
    check_gamma,
    check_seed,
    check_temperature,
    check_top_k,
    check_top_p,
    check_tree,
    check_tree_coupling,
)

Progress = Callable[[str], None]


@dataclass
class RunSettings:
    """What the dashboard runs. `preset` names where target/draft came from (informational once filled in);
    `target` is a folder, hub id or .gguf file; `draft` a spec string ("rtn4", "rtn3-g64", "bnb-int8") or a
    sibling folder / hub id; top_k 0 and top_p 1.0 mean off; temperature 0 is greedy."""

    target: str = ""
    draft: str = "rtn4"
    gamma: int | str = 4
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 1
    prompt: str = ""
    preset: str = ""
    chat: bool = False
    measure_baseline: bool = True
    ignore_eos: bool = False  # generate exactly max_new_tokens (EOS masked, as min_new_tokens does)
    device: str = ""  # "" : the session's default; cpu | cuda | cuda:N | mps | auto
    dtype: str = ""   # "" : the session's default; float32 | bfloat16 | float16 | auto
    early_exit: bool = False  # the draft may end a round early when another token does not pay (hfspec.decoding.early_exit)
    tree: int | str = 0  # 2..8: candidates per unsure draft position (hfspec.decoding.siblings); "auto": a token tree
    # (hfspec.decoding.trees); 0 or 1: the plain chain
    coupling: str = "rejection"  # or "gumbel": draft-invariant sampling, the text fixed by the seed (hfspec.decoding.coupling)
    prepack: bool = False  # fp32 target on the CPU: a oneDNN-prepacked copy of every linear weight (faster steps and
    # verify passes, a second fp32 copy in memory; hfspec.kernels.fast_linear); False: the session's default

    @classmethod
    def from_preset(cls, name: str, **overrides) -> RunSettings:
        """Settings filled from a preset (name or .toml path), then `overrides`."""
        return load_preset(name).settings(**overrides)

    def validated(self) -> RunSettings:
        """Self, after checking every field's type and range (HfspecError naming the field and what is allowed)."""
        for name, what in (("target", "a model folder, a hub id (owner/name) or a .gguf file"),
                           ("draft", registry.allowed()),
                           ("prompt", "some text to continue")):
            value = getattr(self, name)
            if not isinstance(value, str) or not (value if name == "prompt" else value.strip()):
                raise bad_value(name, value, what)
            if name != "prompt":  # a name the OS refuses: said now, before any model loads
                check_name_lengths(value.strip(), name)
        check_gamma(self.gamma)
        check_tree(self.tree)
        check_coupling(self.coupling)
        check_tree_coupling(self.tree, self.coupling)
        check_temperature(self.temperature)  # None is "off" for the API, not a settings value
        check_top_k(self.top_k)
        check_top_p(self.top_p)
        check_count("max_new_tokens", self.max_new_tokens, 1)
        check_seed(self.seed, optional=False, unsigned=True)
        for name in ("chat", "measure_baseline", "ignore_eos", "early_exit", "prepack"):
            check_flag(name, getattr(self, name))
        for name, parse in (("device", parse_device), ("dtype", parse_dtype)):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise bad_value(name, value, "a string (empty for the session's default)")
            if value:
                parse(value, role="settings")
        return self

    def sampling_kwargs(self) -> dict:
        """Keyword arguments of hfspec.plain_generate (and of hfspec.generate, with `gamma` added)."""
        return {
            "temperature": float(self.temperature),
            "top_k": int(self.top_k),  # 0 passed as 0: None would leave transformers' default top-k of 50
            "top_p": float(self.top_p),
            "max_new_tokens": int(self.max_new_tokens),
            "seed": int(self.seed),
        } | ({"min_new_tokens": int(self.max_new_tokens)} if self.ignore_eos else {}) | (
            {"coupling": self.coupling} if self.coupling != "rejection" else {})

    def generate_kwargs(self) -> dict:
        return ({"gamma": self.gamma, **self.sampling_kwargs()} | ({"early_exit": True} if self.early_exit else {})
                | ({"tree": self.tree} if self.tree == "auto" or self.tree > 1 else {}))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def draft_spec(kind: str, bits: int = 4, group: int = 0, bnb_type: str = "nf4", source: str = "",
               **values) -> str:
    """The spec string for a draft kind and its form values (a thin wrapper over `registry.spec_of`); the
    positional form values are the built-in kinds' fields in order (group 0: the default group size)."""
    values = {"bits": bits, "group": group, "bnb_type": bnb_type, "source": source, **values}
    entry = next((k for k in registry.choices() if k.name == kind), None)
    if entry is not None:
        for f in entry.fields:
            if f.text and not str(values.get(f.name, "")).strip():
                raise HfspecError(f"draft {kind} {f.title}: empty; allowed: {entry.allowed}")
    return registry.spec_of(kind, values)


def split_draft_spec(spec: str) -> dict:
    """The inverse of :func:`draft_spec` (`registry.fields_of`): {"kind": name, field: value, ...}; a spec the
    registry cannot read (e.g. a folder that is gone) comes back as the model kind's source, for the form to
    show."""
    try:
        return registry.fields_of(spec.strip())
    except HfspecError:
        values = {f.name: f.default for kind in registry.choices() for f in kind.fields}
        return values | {"kind": registry.model_kind().name, "source": spec.strip()}


def context_length(source: str) -> int | None:
    """The positions a local model folder's config allows (max_position_embeddings, n_positions, ...); None
    when unknown (hub ids, .gguf files, folders without config.json)."""
    path = Path(str(source).strip()).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for cfg in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return cfg[key]
    return None


def parse_list(text: str) -> list[str]:
    """Drafts (or 'target | draft' pairs) from a comma- or newline-separated list."""
    items = []
    for line in text.replace(",", "\n").splitlines():
        if line.strip():
            items.append(line.strip())
    return items


def encode_prompt(settings: RunSettings, tokenizer):
    """Token ids [1, n] of the settings' prompt, chat-templated when `chat` is set and the tokenizer has one."""
    if settings.chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": settings.prompt}],
                                             add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)["input_ids"]
    return tokenizer(settings.prompt, return_tensors="pt").input_ids


def build_draft(target, spec: str, tokenizer, progress: Progress | None = None):
    """The draft `spec` for `target`: kinds that take any option (a model to load) get the target's tokenizer
    to check against; kinds that report while building get `progress`."""
    parsed = registry.parse(spec.strip())
    if progress is not None:
        progress(f"building draft {parsed.label}…")
    kind = registry.KINDS.get(parsed.kind)
    options = {"target_tokenizer": tokenizer} if kind and kind.options is None else {}
    if progress is not None and kind and (kind.options is None or "progress" in kind.options):
        options["progress"] = progress
    return make_draft(target, spec.strip(), **options)


# ------------------------------------------------------------------------------------------------ preset
@dataclass
class Preset:
    """A validated preset: `RunSettings` read from a file (`run_settings`, named after the preset) and the file's
    own keys. ``target`` / ``draft`` are resolved: local folders become absolute paths, hub ids and quantisation
    specs stay as written (``raw`` keeps the file's own values). The run fields read as attributes
    (``preset.gamma``, ``preset.draft``, ...), forwarded to `run_settings`."""

    run_settings: RunSettings
    name: str
    needs_download: bool
    description: str = ""
    path: Path | None = None
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def embedded(self) -> bool:
        """True when everything it needs ships with hfspec (no download)."""
        return not self.needs_download

    @property
    def draft_kind(self) -> str:
        """"quant" for a draft that copies the target (`DraftKind.copies_target`), the model kind's name for a
        folder or hub id, else the registry's kind name."""
        kind = registered_kind(self.draft)
        if kind is None:
            return registry.model_kind().name
        return "quant" if kind.copies_target else kind.name

    def settings(self, **overrides) -> RunSettings:
        """The preset as `RunSettings` (the one description of a run), then `overrides`."""
        return replace(self.run_settings, **overrides)

    def sampling_kwargs(self) -> dict:
        """Keyword arguments for hfspec.generate / plain_generate (top_k 0 and top_p 1.0 mean off)."""
        return self.run_settings.generate_kwargs()

    def encode_prompt(self, tokenizer, prompt: str | None = None):
        """Token ids [1, n] for ``prompt`` (default: the preset's), chat-templated when ``chat`` is set."""
        return encode_prompt(self.settings(**({} if prompt is None else {"prompt": prompt})), tokenizer)

    def build(self, progress=None, dtype=None, device=None):
        """Load the target and its tokenizer, then build the draft: returns (target, draft, tokenizer)."""
        say = progress if callable(progress) else None
        if say:
            say(f"preset {self.name}: target {self.target}, draft {self.draft}")
        target = load_model(self.target, dtype=dtype, device=device, progress=progress, role="target")
        tokenizer = load_tokenizer(self.target, role="target")
        return target, build_draft(target, self.draft, tokenizer, say), tokenizer

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("name", *ALLOWED_KEYS)} | {"path": str(self.path) if self.path else None}


def _forward(name: str) -> property:
    def set_value(self, value) -> None:
        self.run_settings = replace(self.run_settings, **{name: value})

    return property(lambda self: getattr(self.run_settings, name), set_value, doc=f"The preset's `RunSettings.{name}`.")


for _name in RUN_KEYS:  # preset.gamma, preset.draft, ...: the run's fields, kept once in run_settings
    setattr(Preset, _name, _forward(_name))


# ------------------------------------------------------------------------------------------------ loading
def load_preset(name_or_path) -> Preset:
    """Read and validate a preset (a name from `hfspec.io.presets.list_presets` or a path to a .toml file)."""
    data, path = read_preset(name_or_path)
    return preset_from_dict(data, name=path.stem, base=path.parent, path=path)


def preset_from_dict(data: dict, *, name: str = "custom", base: Path | None = None, path: Path | None = None) -> Preset:
    """Validate a preset given as a dict: its keys (`hfspec.io.presets.preset_values`), then its run fields where
    every run's settings are checked (`RunSettings.validated`), then its folders, resolved against ``base``
    (default: cwd)."""
    values = preset_values(data, name=name)
    run = {k: values[k] for k in RUN_KEYS}
    try:
        settings = RunSettings(**run, preset=name).validated()
    except HfspecError as exc:
        raise HfspecError(f"preset {name}: {exc}") from exc
    settings = replace(settings, temperature=float(settings.temperature), top_p=float(settings.top_p),
                       **resolve_sources(values, name=name, base=base))
    return Preset(settings, name=name, needs_download=values["needs_download"], description=values["description"],
                  path=path, raw=dict(data))
