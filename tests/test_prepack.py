"""Prepacked fp32 targets from the front ends (`hfspec.kernels.fast_linear` through `--prepack`,
`RunSettings.prepack` and `Session(prepack=True)`): the same greedy text, a prepacked target cached apart from the
unpacked one, and refusals naming prepack, before anything decodes, for targets it cannot serve."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import build

from hfspec import cli
from hfspec.cli.arguments import build_parser
from hfspec.errors import HfspecError
from hfspec.kernels import fast_linear
from hfspec.session import RunSettings, Session

presets = pytest.importorskip("hfspec.io.presets")
needs_onednn = pytest.mark.skipif(not fast_linear.available(), reason="no oneDNN prepacked linear in this torch")


@pytest.fixture(scope="module")
def micro():
    if "micro-rtn4" not in presets.list_presets():
        pytest.skip("micro-rtn4 preset absent")
    return RunSettings.from_preset("micro-rtn4", max_new_tokens=12, temperature=0, measure_baseline=False,
                                   ignore_eos=True)


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("verb", ["run", "sweep", "compare", "bench"])
def test_every_decoding_verb_takes_prepack(verb):
    drafts = ["--drafts", "rtn4"] if verb == "compare" else []
    assert build_parser().parse_args([verb, *drafts, "--prepack"]).prepack is True
    assert build_parser().parse_args([verb, *drafts]).prepack is False


def test_the_flag_reaches_the_settings_and_the_session(micro):
    on = build_parser().parse_args(["run", "--prepack"])
    off = build_parser().parse_args(["run"])
    assert cli._settings(on).prepack is True and cli._session(on).prepack is True
    assert cli._settings(off).prepack is False and cli._session(off).prepack is False


@needs_onednn
def test_hfspec_run_prepack_says_what_it_added_and_refuses_bf16(micro, capsys):
    args = ["run", "--max-new-tokens", "6", "--temperature", "0", "--no-baseline", "--json"]
    assert cli.main([*args, "--prepack"]) == 0
    err = capsys.readouterr().err
    assert "prepacked the target's linear weights" in err and "MiB added" in err
    assert cli.main(args) == 0
    assert "prepacked" not in capsys.readouterr().err  # negative control: no flag, no prepacking
    assert cli.main([*args, "--prepack", "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "prepack: got a bfloat16 target; allowed: a float32 target on the CPU" in err
    assert "loading target" not in err  # refused before anything loads


# ------------------------------------------------------------------------------------------------ the session
@needs_onednn
def test_a_prepacked_run_decodes_the_same_text_on_its_own_cached_target(micro):
    session = Session()
    said = []
    packed_run = session.run(replace(micro, prepack=True), progress=said.append)
    assert any(line.startswith("prepacked the target's linear weights") for line in said)
    plain_run = session.run(micro)  # asked for no prepacking: never the prepacked target cached just before
    assert plain_run.text == packed_run.text and plain_run.stats.new_tokens == 12
    assert packed_run.settings.prepack is True and plain_run.settings.prepack is False
    packed, _, _ = session.load(replace(micro, prepack=True))
    plain, _, _ = session.load(micro)
    assert packed is not plain
    assert fast_linear.prepacked_bytes(packed) > 0 and fast_linear.prepacked_bytes(plain) == 0
    # the session's default: its runs that leave prepack out get the prepacked target
    default = Session(prepack=True)
    assert fast_linear.prepacked_bytes(default.load(micro)[0]) > 0
    assert fast_linear.prepacked_bytes(default.load_target(micro.target)[0]) > 0


@needs_onednn
def test_prepack_refuses_a_bf16_target_before_decoding(micro, tmp_path):
    session = Session()
    said = []
    with pytest.raises(HfspecError, match=r"^prepack: got a bfloat16 target; allowed: a float32 target on the CPU"):
        session.run(replace(micro, dtype="bfloat16", prepack=True), progress=said.append)
    assert said == []  # asked for bf16: refused before loading
    # a bf16 checkpoint loaded at its own dtype ("auto"): refused once its dtype is known, and not cached
    build("llama").to(torch.bfloat16).save_pretrained(tmp_path)
    with pytest.raises(HfspecError, match=r"^prepack: got a target of bfloat16 on cpu; allowed: a float32 target"):
        session.load_target(str(tmp_path), prepack=True)
    said.clear()
    with pytest.raises(HfspecError, match="^prepack: "):
        session.load_target(str(tmp_path), progress=said.append, prepack=True)
    assert any(line.startswith("loading target") for line in said)  # loaded again: the refused one was not kept


@needs_onednn
def test_prepack_without_the_memory_for_its_copy_is_refused_and_nothing_is_kept(micro, monkeypatch):
    from hfspec.io import memory

    session = Session()
    model = session.load_target(micro.target)[0]
    free = memory.available_bytes()
    if free is None:
        pytest.skip("this system does not say how much memory is available")
    real = fast_linear.unpacked_bytes
    monkeypatch.setattr(fast_linear, "unpacked_bytes", lambda m: free)  # a copy as big as all that is free
    said = []
    with pytest.raises(HfspecError, match=r"^prepack: the oneDNN copy of the target's linear weights needs .* "
                                          r"more memory but .* is available; nothing was prepacked; allowed: prepack off"):
        session.run(replace(micro, prepack=True), progress=said.append)
    assert any(line.startswith("loading target") for line in said)  # checked on the loaded target's own weights
    assert not any(line.startswith("prepacked") for line in said)
    assert fast_linear.prepacked_bytes(model) == 0  # the unpacked target the session holds is untouched
    assert session.run(micro).stats.new_tokens == 12  # and still runs
    # negative control: the real copy's size fits, and the same request prepacks
    monkeypatch.setattr(fast_linear, "unpacked_bytes", real)
    said.clear()
    session.run(replace(micro, prepack=True), progress=said.append)
    assert any(line.startswith("prepacked the target's linear weights") for line in said)


def test_prepack_without_onednn_is_refused_by_name(micro, monkeypatch):
    monkeypatch.setattr(fast_linear, "available", lambda: False)  # a torch built without oneDNN
    with pytest.raises(HfspecError, match="^prepack: this torch .* has no oneDNN prepacked linear"):
        Session().run(replace(micro, prepack=True))
    assert Session().run(micro).stats.new_tokens == 12  # negative control: unpacked runs are untouched


# ------------------------------------------------------------------------------------------------ settings
def test_prepack_is_a_checked_flag():
    base = RunSettings(target="presets/models/micro", prompt="Return the")
    assert base.prepack is False and replace(base, prepack=True).validated().prepack is True
    with pytest.raises(HfspecError, match=r"^prepack: got 'yes'; allowed: True or False"):
        replace(base, prepack="yes").validated()
    with pytest.raises(HfspecError, match="^prepack: got 1"):
        Session(prepack=1)
    assert RunSettings.from_dict(replace(base, prepack=True).to_dict()).prepack is True
