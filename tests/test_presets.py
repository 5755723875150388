"""Presets: every shipped preset parses and resolves; bad presets give errors naming the field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hfspec.errors import HfspecError
from hfspec.io.presets import ALLOWED_KEYS, DEFAULT_PRESET, list_presets, presets_dir
from hfspec.settings import Preset, load_preset, preset_from_dict

REPO_PRESETS = Path(__file__).resolve().parents[1] / "presets"
REQUIRED_NAMES = {
    "micro-rtn4", "micro-rtn3", "micro-nano", "smollm2-360m-135m", "qwen2.5-1.5b-0.5b", "gpt2-large-gpt2",
    "smollm2-135m-rtn4",
}
EMBEDDED = REPO_PRESETS / "models"

GOOD = """
description = "test"
target = "{target}"
draft = "{draft}"
gamma = {gamma}
temperature = 1.0
top_k = 0
top_p = 1.0
max_new_tokens = 8
seed = 3
prompt = "Return the"
needs_download = {needs}
"""


def write(tmp_path: Path, name="custom", target=None, draft="rtn4", gamma="4", needs="false", extra="") -> Path:
    target = target if target is not None else str(EMBEDDED / "micro")
    path = tmp_path / f"{name}.toml"
    path.write_text(GOOD.format(target=target, draft=draft, gamma=gamma, needs=needs) + extra)
    return path


def test_presets_dir_is_repo_folder(monkeypatch):
    monkeypatch.delenv("HFSPEC_PRESETS", raising=False)
    assert presets_dir() == REPO_PRESETS.resolve()


def test_shipped_presets_listed():
    names = set(list_presets())
    assert REQUIRED_NAMES <= names
    assert DEFAULT_PRESET in names


@pytest.mark.parametrize("name", sorted(p.stem for p in REPO_PRESETS.glob("*.toml")))
def test_every_shipped_preset_loads(name):
    p = load_preset(name)
    assert isinstance(p, Preset)
    assert p.name == name and p.path == REPO_PRESETS.resolve() / f"{name}.toml"
    assert p.description and p.prompt
    assert p.gamma == "auto" or (isinstance(p.gamma, int) and p.gamma >= 1)
    if not p.needs_download:
        assert Path(p.target).is_absolute() and (Path(p.target) / "config.json").is_file()
        assert (Path(p.target) / "model.safetensors").is_file()
        if p.draft_kind == "sibling":
            assert (Path(p.draft) / "config.json").is_file()
    else:
        assert "/" in p.target and not Path(p.target).is_absolute()
    kw = p.sampling_kwargs()
    fixed = ({"min_new_tokens"} if p.ignore_eos else set()) | ({"tree"} if p.tree != 0 else set())
    assert set(kw) == {"gamma", "temperature", "top_k", "top_p", "max_new_tokens", "seed"} | fixed


def test_default_and_embedded_presets():
    p = load_preset(DEFAULT_PRESET)
    assert p.draft == "rtn4-compiled" and not p.needs_download and p.embedded
    assert Path(p.target) == (EMBEDDED / "micro").resolve()
    nano = load_preset("micro-nano")
    assert Path(nano.draft) == (EMBEDDED / "nano").resolve() and nano.draft_kind == "sibling"
    assert load_preset("micro-rtn3").draft == "rtn3"


@pytest.mark.parametrize("name", sorted(p.stem for p in REPO_PRESETS.glob("micro-*.toml")))
def test_embedded_presets_demo_their_advertised_length(name):
    """A shipped demo runs its max_new_tokens (a sampled text could meet </s> within a few tokens; micro-auto's
    sample follows measured timings, so it generates a fixed length)."""
    from hfspec.session import RunSettings, Session

    settings = RunSettings.from_preset(name, measure_baseline=False)
    result = Session().run(settings)
    assert result.stats.new_tokens == settings.max_new_tokens and result.stats.stop_reason == "max_tokens"


def test_ignore_eos_key(tmp_path):
    assert not load_preset(str(write(tmp_path))).ignore_eos
    p = load_preset(str(write(tmp_path, extra="ignore_eos = true\n")))
    assert p.ignore_eos and p.sampling_kwargs()["min_new_tokens"] == p.max_new_tokens
    with pytest.raises(HfspecError, match="ignore_eos"):
        load_preset(str(write(tmp_path, extra='ignore_eos = "yes"\n')))


def test_tree_and_coupling_keys_reach_the_settings_and_are_checked_by_run_settings(tmp_path):
    p = load_preset(str(write(tmp_path)))
    assert (p.tree, p.coupling) == (0, "rejection")
    s = load_preset(str(write(tmp_path, extra='tree = "auto"\n'))).settings()
    assert (s.tree, s.coupling) == ("auto", "rejection")
    assert load_preset(str(write(tmp_path, extra='coupling = "gumbel"\n'))).settings().coupling == "gumbel"
    for extra, field in (('tree = 9\n', "tree"), ('tree = "wide"\n', "tree"), ('coupling = "max"\n', "coupling"),
                         ('tree = 3\ncoupling = "gumbel"\n', "tree")):
        with pytest.raises(HfspecError, match=f"preset custom: {field}: "):
            load_preset(str(write(tmp_path, extra=extra)))


def test_load_by_path_resolves_relative_to_file(tmp_path):
    (tmp_path / "models").symlink_to(EMBEDDED, target_is_directory=True)
    path = write(tmp_path, target="models/micro", draft="models/nano")
    p = load_preset(str(path))
    assert p.name == "custom" and p.path == path.resolve()
    assert Path(p.target) == (tmp_path / "models" / "micro").resolve()
    assert Path(p.draft).name == "nano"
    assert p.seed == 3 and p.max_new_tokens == 8


def test_env_override(tmp_path, monkeypatch):
    write(tmp_path, name="mine")
    monkeypatch.setenv("HFSPEC_PRESETS", str(tmp_path))
    assert list_presets() == ["mine"]
    assert load_preset("mine").name == "mine"
    monkeypatch.setenv("HFSPEC_PRESETS", str(tmp_path / "nope"))
    with pytest.raises(HfspecError, match="HFSPEC_PRESETS"):
        list_presets()


def test_unknown_preset_lists_available():
    with pytest.raises(HfspecError, match="micro-rtn4") as err:
        load_preset("no-such-preset")
    assert "no-such-preset" in str(err.value) and "micro-nano" in str(err.value)
    with pytest.raises(HfspecError, match="not found"):
        load_preset("/nonexistent/thing.toml")


def test_unknown_key_named_with_allowed_keys(tmp_path):
    path = write(tmp_path, extra='gama = 3\n')
    with pytest.raises(HfspecError) as err:
        load_preset(str(path))
    msg = str(err.value)
    assert "'gama'" in msg and "allowed keys" in msg
    for key in ALLOWED_KEYS:
        assert key in msg


@pytest.mark.parametrize("key", ["target", "draft", "prompt", "needs_download"])
def test_missing_required_key(key):
    data = {"target": str(EMBEDDED / "micro"), "draft": "rtn4", "prompt": "x", "needs_download": False}
    del data[key]
    with pytest.raises(HfspecError, match=f"missing required key '{key}'"):
        preset_from_dict(data)


def test_defaults_for_optional_keys():
    p = preset_from_dict({"target": str(EMBEDDED / "micro"), "draft": "rtn4", "prompt": "x", "needs_download": False})
    assert (p.gamma, p.temperature, p.top_k, p.top_p, p.max_new_tokens, p.seed, p.chat) == (4, 1.0, 0, 1.0, 64, 1, False)
    # passed as off, explicitly: None would leave transformers' default top-k of 50 in place
    assert p.sampling_kwargs()["top_k"] == 0 and p.sampling_kwargs()["top_p"] == 1.0


def test_top_k_zero_means_no_top_k_warper(monkeypatch):
    import hfspec.api
    from hfspec.session import RunSettings, Session

    seen = []
    real = hfspec.api.Scorer
    monkeypatch.setattr(hfspec.api, "Scorer", lambda procs, *a: seen.append([type(p).__name__ for p in procs])
                        or real(procs, *a))
    settings = RunSettings.from_preset("micro-rtn4", measure_baseline=False, max_new_tokens=4)
    Session().run(settings)
    Session().run(replace(settings, top_k=7))
    assert not any("TopK" in name for name in seen[0]) and any("TopK" in name for name in seen[1])


@pytest.mark.parametrize("gamma", ["0", "-2", "65", '"fast"', "2.5", "true"])
def test_bad_gamma(tmp_path, gamma):
    with pytest.raises(HfspecError, match="gamma"):
        load_preset(str(write(tmp_path, gamma=gamma)))


def test_gamma_auto_ok(tmp_path):
    assert load_preset(str(write(tmp_path, gamma='"auto"'))).gamma == "auto"


@pytest.mark.parametrize("spec", ["rtn9", "rtn1", "rtn4-g4", "rtnx", "bnb-int4", "bnb"])
def test_bad_draft_spec(tmp_path, spec):
    with pytest.raises(HfspecError, match="draft") as err:
        load_preset(str(write(tmp_path, draft=spec)))
    assert "rtn" in str(err.value)  # lists the allowed specs


@pytest.mark.parametrize("spec", ["rtn4", "rtn3", "rtn3-g64", "rtn8", "bnb-int8", "bnb-nf4", "RTN4"])
def test_good_draft_specs(tmp_path, spec):
    assert load_preset(str(write(tmp_path, draft=spec))).draft == spec.lower()


def test_missing_embedded_model_folder(tmp_path):
    with pytest.raises(HfspecError, match="target folder 'models/gone' not found"):
        load_preset(str(write(tmp_path, target="models/gone")))
    with pytest.raises(HfspecError, match="draft folder"):
        load_preset(str(write(tmp_path, draft="./models/gone")))


def test_hub_id_needs_download_flag(tmp_path):
    with pytest.raises(HfspecError, match="needs_download"):
        load_preset(str(write(tmp_path, target="HuggingFaceTB/SmolLM2-135M", needs="false")))
    p = load_preset(str(write(tmp_path, target="HuggingFaceTB/SmolLM2-135M", needs="true")))
    assert p.target == "HuggingFaceTB/SmolLM2-135M" and p.needs_download


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HfspecError, match="config.json"):
        load_preset(str(write(tmp_path, target="empty")))


@pytest.mark.parametrize(
    "key, value",
    [("temperature", '"hot"'), ("top_k", "1.5"), ("top_p", "0"), ("top_p", "1.5"), ("max_new_tokens", "0"),
     ("seed", '"x"'), ("temperature", "-1.0"), ("needs_download", '"no"'), ("description", "3"), ("chat", "1")],
)
def test_bad_values_name_the_field(tmp_path, key, value):
    text = write(tmp_path).read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines) + f"\n{key} = {value}\n")
    with pytest.raises(HfspecError, match=key):
        load_preset(str(path))


def test_invalid_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("target = \n")
    with pytest.raises(HfspecError, match="TOML"):
        load_preset(str(path))


def test_build_micro_rtn4_and_nano():
    import torch

    from hfspec import generate

    for name in ("micro-rtn4", "micro-nano"):
        p = load_preset(name)
        target, draft, tok = p.build(progress=False)
        assert draft is not target
        ids = p.encode_prompt(tok)
        kw = p.sampling_kwargs() | {"max_new_tokens": 12}
        out = generate(target, ids, draft=draft, **kw)
        assert out.sequences.shape[1] <= ids.shape[1] + 12
        assert torch.equal(out.sequences[:, : ids.shape[1]], ids)


def test_encode_prompt_plain_and_chat():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(EMBEDDED / "micro")
    p = load_preset("micro-rtn4")
    ids = p.encode_prompt(tok)
    assert ids.shape[0] == 1 and tok.decode(ids[0], skip_special_tokens=True) == p.prompt
    tok.chat_template = "{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}Assistant:"
    p.chat = True
    text = tok.decode(p.encode_prompt(tok, "Hi")[0], skip_special_tokens=True)
    assert text == "User: Hi\nAssistant:"
