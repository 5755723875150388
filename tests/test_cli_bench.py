"""`hfspec bench` / `compare_methods` for every draft kind, CLI help from the draft registry, --ignore-eos."""

import json

import pytest
import torch
from tiny_models import build

import hfspec
from hfspec.attrs import DRAFT_SPEC, get_attr
from hfspec.cli import build_parser, main
from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.measure.benchmark import compare_methods, hf_assisted
from hfspec.settings import load_preset

PROMPT = torch.tensor([[0, 5, 17, 33, 5, 17]])


@pytest.fixture(scope="module")
def target():
    return build("llama", init=0.2)


def test_bench_runs_a_prompt_lookup_draft(capsys):
    code = main(["bench", "--preset", "micro-rtn4", "--draft", "lookup", "--max-new-tokens", "6", "--repeats", "1",
                 "--temperature", "0", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["tokens_per_second"]) == {"plain generate", "HF assisted", "hfspec"}
    gamma = load_preset("micro-rtn4").gamma  # the HF baseline proposes as many tokens as the preset's γ
    assert f"prompt_lookup_num_tokens={gamma}" in result["hf_assistant"]


@pytest.mark.parametrize("spec, expect", [("lookup-n2", "prompt_lookup_num_tokens=3, max_matching_ngram_size=2"),
                                          ("rtn4", "through the HF forward")])
def test_compare_methods_derives_an_hf_assistant(target, spec, expect):
    draft = hfspec.make_draft(target, spec)
    result = compare_methods(target, draft, PROMPT, gamma=3, max_new_tokens=5, repeats=1, warmup=False)
    assert expect in result["hf_assistant"]
    assert result["tokens_per_second"]["HF assisted"] > 0 and 0 <= result["alpha"] <= 1


def test_lean_rtn_draft_gets_its_hf_forward_copy(target):
    lean = hfspec.make_draft(target, "rtn4")
    assert not callable(getattr(lean, "generate", None)), "the lean draft is what HF assisted cannot run"
    kwargs, _ = hf_assisted(target, lean, 4)
    assistant = kwargs["assistant_model"]
    assert callable(assistant.generate) and assistant is not lean
    assert get_attr(assistant, DRAFT_SPEC) == get_attr(lean, DRAFT_SPEC)


def test_a_sibling_is_its_own_assistant_and_keeps_its_generation_config(target):
    sibling = build("llama", init=0.2, layers=1, seed=3)
    before = sibling.generation_config.num_assistant_tokens
    result = compare_methods(target, sibling, PROMPT, gamma=2, max_new_tokens=4, repeats=1, warmup=False)
    assert "the draft itself" in result["hf_assistant"]
    assert sibling.generation_config.num_assistant_tokens == before


def test_given_assistant_must_have_generate(target):
    with pytest.raises(HfspecError, match="assistant"):
        hf_assisted(target, hfspec.make_draft(target, "rtn4"), 4, assistant=torch.nn.Linear(2, 2))


def _help(command: str, flag: str) -> str:
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    return sub.choices[command]._option_string_actions[flag].help


@pytest.mark.parametrize("command, flag", [("run", "--draft"), ("bench", "--draft"), ("sweep", "--drafts"),
                                           ("compare", "--drafts")])
def test_draft_help_lists_every_registered_kind(command, flag):
    text = _help(command, flag)
    assert registry.allowed() in text
    for kind in registry.choices():
        assert kind.allowed in text


class _Captured(Exception):
    pass


@pytest.mark.parametrize("preset, flag, expected", [("micro-auto", [], True), ("micro-auto", ["--ignore-eos"], True),
                                                    ("micro-nano", [], False), ("micro-nano", ["--ignore-eos"], True)])
def test_ignore_eos_flag_only_turns_it_on(monkeypatch, preset, flag, expected):
    import hfspec.cli as cli

    seen = []

    class Session:
        def run(self, settings, progress=None):
            seen.append(settings)
            raise HfspecError("captured")

    monkeypatch.setattr(cli, "_session", lambda args: Session())
    assert main(["run", "--preset", preset, "--no-baseline", *flag]) == 2
    assert seen[0].ignore_eos is expected
