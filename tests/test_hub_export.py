"""`hfspec export-hub`: the folder follows transformers' custom_generate convention and runs hfspec through
`model.generate(custom_generate=<folder>, trust_remote_code=True, ...)`, offline, on the embedded micro pair."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import Collect

import hfspec
from hfspec.cli import main
from hfspec.errors import HfspecError
from hfspec.hub_export import CACHE_ATTRIBUTE, export_hub, forget_drafts

MODELS = Path(__file__).resolve().parents[1] / "presets" / "models"
N = 24  # new tokens per run (min_new_tokens = max_new_tokens: every run makes exactly N)


@pytest.fixture(scope="module")
def micro():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MODELS / "micro", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(MODELS / "micro", local_files_only=True)
    return model, tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return export_hub(tmp_path_factory.mktemp("hub") / "hfspec_hub_test")


@pytest.fixture(autouse=True)
def _fresh_drafts(micro):
    forget_drafts(micro[0])
    yield
    forget_drafts(micro[0])


def _ids(tok, text="Once upon a time there was"):
    return tok(text, return_tensors="pt").input_ids


def _hub(model, ids, folder, **kwargs):
    kwargs.setdefault("max_new_tokens", N)
    kwargs.setdefault("min_new_tokens", kwargs["max_new_tokens"])
    return model.generate(ids, custom_generate=str(folder), trust_remote_code=True, **kwargs)


def test_folder_layout_front_matter_and_requirements(folder):
    from transformers.dynamic_module_utils import check_python_requirements
    from transformers.utils.import_utils import split_package_version

    code = folder / "custom_generate"
    assert (code / "generate.py").is_file()
    source = (code / "generate.py").read_text()
    compile(source, "generate.py", "exec")
    assert "def generate(model, *args" in source and "from hfspec.hub_export import hub_generate" in source
    readme = (folder / "README.md").read_text()
    front = readme.split("---")[1]
    assert "library_name: transformers" in front and "- custom_generate" in front
    assert "custom_generate=" in readme and "trust_remote_code=True" in readme
    lines = (code / "requirements.txt").read_text().split()
    assert {split_package_version(line)[0] for line in lines} == {"hfspec"} and len(lines) == 2
    check_python_requirements(str(folder), requirements_file="custom_generate/requirements.txt")  # installed ones fit


def test_requirements_are_checked(tmp_path, micro):
    model, tok = micro
    out = export_hub(tmp_path / "hub_needs_newer")
    (out / "custom_generate" / "requirements.txt").write_text("hfspec>=99.0\n")
    with pytest.raises(ImportError, match="hfspec>=99.0"):
        _hub(model, _ids(tok), out)


def test_needs_trust_remote_code(micro, folder):
    model, tok = micro
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(_ids(tok), custom_generate=str(folder), max_new_tokens=4)


def test_greedy_identical_to_generate_and_hfspec(micro, folder):
    model, tok = micro
    ids = _ids(tok)
    plain = model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    ours = hfspec.generate(model, ids, draft=hfspec.make_draft(model, "rtn4"), gamma=4, temperature=0,
                           max_new_tokens=N, min_new_tokens=N)
    got = _hub(model, ids, folder, draft="rtn4", gamma=4, do_sample=False)
    assert got.shape == (1, ids.shape[1] + N)
    assert torch.equal(got, plain)
    assert torch.equal(got, ours.sequences)


def test_streamer_receives_the_tokens(micro, folder):
    model, tok = micro
    ids = _ids(tok)
    streamer = Collect()
    out = _hub(model, ids, folder, draft="rtn3", gamma=3, do_sample=False, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()  # the prompt first, as generate does
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamed == out[0, ids.shape[1]:].tolist() and len(streamed) == N


def test_return_dict_stop_strings_and_sampling(micro, folder):
    model, tok = micro
    ids = _ids(tok)
    out = _hub(model, ids, folder, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out, hfspec.SpeculativeOutput) and out.stats.new_tokens == N and out.stats.target_passes < N
    stopped = model.generate(ids, custom_generate=str(folder), trust_remote_code=True, max_new_tokens=60,
                             do_sample=False, stop_strings=["."], tokenizer=tok)
    plain = model.generate(ids, max_new_tokens=60, do_sample=False, stop_strings=["."], tokenizer=tok)
    assert torch.equal(stopped, plain)
    torch.manual_seed(0)
    sampled = _hub(model, ids, folder, do_sample=True, temperature=0.8, top_k=0, gamma="auto")
    assert sampled.shape == (1, ids.shape[1] + N)


def test_bad_spec_and_gamma_are_clear_errors(micro, folder):
    model, tok = micro
    with pytest.raises(HfspecError, match=r"draft: unknown spec 'turbo'; allowed specs: rtn2..rtn8") as error:
        _hub(model, _ids(tok), folder, draft="turbo")
    assert "lookup" in str(error.value)
    with pytest.raises(HfspecError, match=r"gamma: got 0.*allowed: an integer from 1 to 64"):
        _hub(model, _ids(tok), folder, gamma=0)
    with pytest.raises(HfspecError, match="draft: got both draft= and assistant_model="):
        _hub(model, _ids(tok), folder, draft="rtn4", assistant_model=model)
    assert not model.__dict__.get(CACHE_ATTRIBUTE)  # nothing was built


def test_draft_built_once_across_calls(micro, folder, monkeypatch):
    import hfspec.hub_export

    model, tok = micro
    real, built = hfspec.hub_export.make_draft, []

    def counting(target, spec, **options):
        built.append(spec)
        return real(target, spec, **options)

    monkeypatch.setattr(hfspec.hub_export, "make_draft", counting)  # the name hub_generate calls
    ids = _ids(tok)
    first = _hub(model, ids, folder, draft="rtn4", do_sample=False)
    second = _hub(model, ids, folder, draft="rtn4-g32", do_sample=False)  # the same draft, spelled out
    assert torch.equal(first, second)
    assert built == ["rtn4"]
    _hub(model, ids, folder, draft="rtn3", do_sample=False)
    assert built == ["rtn4", "rtn3"] and len(model.__dict__[CACHE_ATTRIBUTE]) == 2
    assert forget_drafts(model) == 2


def test_draft_as_model_folder_and_default(micro, folder):
    from transformers import AutoModelForCausalLM

    model, tok = micro
    ids = _ids(tok)
    plain = model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    nano = AutoModelForCausalLM.from_pretrained(MODELS / "nano", local_files_only=True).eval()
    assert torch.equal(_hub(model, ids, folder, draft=nano, do_sample=False), plain)
    assert torch.equal(_hub(model, ids, folder, assistant_model=nano, do_sample=False), plain)
    assert not model.__dict__.get(CACHE_ATTRIBUTE)  # a model object is used as given, not kept
    assert torch.equal(_hub(model, ids, folder, draft=str(MODELS / "nano"), do_sample=False), plain)
    assert torch.equal(_hub(model, ids, folder, do_sample=False), plain)  # the folder's default draft
    labels = {key[0] for key in model.__dict__[CACHE_ATTRIBUTE]}
    assert labels == {str(MODELS / "nano"), "rtn4-g32"}


def test_cli_export_hub(tmp_path, capsys):
    out = tmp_path / "cli_hub"
    assert main(["export-hub", str(out), "--draft", "rtn3-g64", "--gamma", "5"]) == 0
    source = (out / "custom_generate" / "generate.py").read_text()
    assert 'DRAFT = "rtn3-g64"' in source and "GAMMA = 5" in source
    assert "custom_generate=" in capsys.readouterr().out
    assert main(["export-hub", str(out)]) == 2  # not empty
    assert "not empty" in capsys.readouterr().err
    assert main(["export-hub", str(tmp_path / "bad"), "--draft", "rtn1"]) == 2
    assert "allowed specs" in capsys.readouterr().err and not (tmp_path / "bad").exists()
