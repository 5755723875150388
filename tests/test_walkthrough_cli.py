"""Defects a user met on the command line and the API (issue 30): a missing optional extra is an error naming the
extra to install, on every path that needs one; a path name the OS refuses is an error naming the field, before
anything loads; `hfspec gui --threads N` is accepted and applied; a compile-cache hit does not claim to compile.

Missing packages are simulated (sys.modules[name] = None, importlib.metadata raising): the test venv has them."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch

from hfspec.cli import main
from hfspec.errors import HfspecError
from hfspec.extras import EXTRAS, require_extra

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"
LONG = "a" * 300


def _hide(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError


def _no_model_loads(monkeypatch):
    import hfspec.io.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    real = hfspec.io.loading.load_model
    monkeypatch.setattr(hfspec.io.loading, "load_model", refuse)
    for module in [m for name, m in sys.modules.items() if name.startswith("hfspec.")]:  # imported by name too
        if getattr(module, "load_model", None) is real:
            monkeypatch.setattr(module, "load_model", refuse)


# ------------------------------------------------------------------------------------- optional extras
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_require_extra_names_the_extra_for_every_extra_of_pyproject(monkeypatch, extra):
    _hide(monkeypatch, *(module for module, _ in EXTRAS[extra]))
    with pytest.raises(HfspecError, match=rf"^thing: doing it needs .*; allowed: pip install 'hfspec\[{extra}\]'$"):
        require_extra(extra, "thing", "doing it")


def test_every_optional_extra_of_pyproject_is_known():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    names = {line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line}
    assert names - {"test", "docs"} == set(EXTRAS)  # test and docs are tools for developing hfspec, no code path


def test_export_draft_without_the_export_extra_names_it_before_loading(tmp_path, capsys, monkeypatch):
    """The reported defect: a raw PackageNotFoundError traceback from importlib.metadata."""
    _no_model_loads(monkeypatch)
    real = importlib.metadata.version

    def version(name):
        if name == "compressed-tensors":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr("hfspec.extras.version", version)
    assert main(["export-draft", str(tmp_path / "out"), "--target", str(MICRO)]) == 2
    err = capsys.readouterr().err
    assert "compressed-tensors" in err and "pip install 'hfspec[export]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_export_draft_api_and_loading_back_without_compressed_tensors(tmp_path, monkeypatch):
    from tiny_models import build

    from hfspec.io.export_draft import export_draft
    from hfspec.io.pack_quantized import load_export, quantization_config

    _hide(monkeypatch, "compressed_tensors")
    for call in (lambda: export_draft(build("llama"), "rtn4", tmp_path / "out"),
                 lambda: quantization_config(4, 32, []), lambda: load_export(tmp_path)):
        with pytest.raises(HfspecError, match=r"pip install 'hfspec\[export\]'"):
            call()
    assert not (tmp_path / "out").exists()


def test_bnb_draft_without_bitsandbytes_names_the_extra_cli_and_api(capsys, monkeypatch):
    from tiny_models import build

    from hfspec.drafts import make_draft

    _hide(monkeypatch, "bitsandbytes")
    with pytest.raises(HfspecError, match=r"^draft: .*bitsandbytes.*pip install 'hfspec\[bnb\]'"):
        make_draft(build("llama"), "bnb-nf4")
    _no_model_loads(monkeypatch)
    assert main(["run", "--preset", "micro-rtn4", "--draft", "bnb-nf4", "--no-baseline"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'hfspec[bnb]'" in err and "loading" not in err


def test_gguf_target_without_gguf_names_the_extra(tmp_path, monkeypatch):
    from hfspec.io.loading import load_model

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    _hide(monkeypatch, "gguf")
    with pytest.raises(HfspecError, match=r"^target: .*gguf.*pip install 'hfspec\[gguf\]'"):
        load_model(str(tmp_path / "model.gguf"), role="target")


def test_plot_without_matplotlib_names_the_extra_cli_and_api(tmp_path, capsys, monkeypatch):
    from hfspec.report import plot_sweep

    _hide(monkeypatch, "matplotlib", "matplotlib.figure", "matplotlib.pyplot")
    with pytest.raises(HfspecError, match=r"pip install 'hfspec\[plot\]'"):
        plot_sweep([], tmp_path / "x.png")
    _no_model_loads(monkeypatch)
    assert main(["sweep", "--preset", "micro-rtn4", "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot: " in (err := capsys.readouterr().err) and "pip install 'hfspec[plot]'" in err


def test_gui_without_pyside6_names_the_extra(capsys, monkeypatch):
    _hide(monkeypatch, "PySide6")
    assert main(["gui"]) == 2
    assert "pip install 'hfspec[gui]'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- name too long
def test_a_target_name_over_255_bytes_is_an_error_naming_target_before_loading(tmp_path, capsys, monkeypatch):
    from hfspec.io.loading import load_model
    from hfspec.session import RunSettings

    for target in (f"/tmp/{LONG}", str(tmp_path / LONG / "model"), f"{LONG}.gguf"):
        with pytest.raises(HfspecError, match=r"^target: .* 30[05] bytes long, over the 255"):
            load_model(target, role="target")
        with pytest.raises(HfspecError, match=r"^target: .* 30[05] bytes long"):
            RunSettings.from_preset("micro-rtn4", target=target).validated()
    (tmp_path / "long.toml").write_text(f'target = "{LONG}"\ndraft = "rtn4"\nprompt = "x"\nneeds_download = false\n')
    with pytest.raises(HfspecError, match=r"target: .* 300 bytes long"):  # not the OS's "File name too long"
        RunSettings.from_preset(str(tmp_path / "long.toml"))
    with pytest.raises(HfspecError, match=r"^preset: .* 305 bytes long.*allowed: a preset name"):
        RunSettings.from_preset(f"/tmp/{LONG}.toml")
    _no_model_loads(monkeypatch)
    assert main(["run", "--preset", "micro-rtn4", "--target", f"/tmp/{LONG}", "--no-baseline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfspec: error: target: ") and "255" in err and "loading" not in err


# ------------------------------------------------------------------------------------- gui --threads
class _Opened(Exception):
    pass


def test_hfspec_gui_threads_is_accepted_and_sets_torchs_threads(monkeypatch):
    pytest.importorskip("PySide6")
    import gui.main_window

    seen = {}

    def window(*args, **kwargs):
        seen["threads"] = torch.get_num_threads()
        raise _Opened

    monkeypatch.setattr(gui.main_window, "MainWindow", window)
    torch.set_num_threads(1)
    with pytest.raises(_Opened):  # before the fix: argparse's SystemExit(2), "unrecognized arguments"
        main(["gui", "--threads", "2"])
    assert seen["threads"] == 2
    torch.set_num_threads(1)


# ------------------------------------------------------------------------------------- compile messages
def test_a_compile_cache_hit_does_not_say_the_first_time_takes_a_while(tmp_path, monkeypatch):
    from tiny_models import build

    from hfspec.drafts import make_draft
    from hfspec.kernels import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", tmp_path)
    target = build("llama", seed=5)
    first, second = [], []
    torch._dynamo.reset()
    assert make_draft(target, "rtn4-compiled", progress=first.append).compiled_step is not None
    torch._dynamo.reset()
    assert make_draft(target, "rtn4-compiled", progress=second.append).compiled_step is not None
    assert any("from scratch" in m and "the first time takes a while" in m for m in first), first
    assert not any("first time" in m or "from scratch" in m for m in second), second
    assert second[0].startswith("compiling the draft step") and f"reused from {tmp_path}" in second[-1]
