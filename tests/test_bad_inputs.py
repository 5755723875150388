"""Every bad or unsupported input is one clear HfspecError naming the field, never silent output.

One case per item of the issue (API, drop-in, loading, session settings, CLI); the CLI cases run `main` in
process and expect exit code 2 with a single stderr line (nothing loaded before the error)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_models import build, perturbed
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

import hfspec
from hfspec.cli import main
from hfspec.errors import HfspecError
from hfspec.io.loading import load_model, load_tokenizer
from hfspec.session import RunSettings

PROMPT = torch.tensor([[0, 5, 17, 33]])
MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"


@pytest.fixture(scope="module")
def pair():
    target = build("llama", init=0.2)
    return target, perturbed(target, scale=0.5)


class Fill(LogitsProcessor):
    """Replaces every score with `value` (NaN, or -inf: no token allowed)."""

    def __init__(self, value: float):
        self.value = value

    def __call__(self, input_ids, scores):
        return torch.full_like(scores, self.value)


class Sink(BaseStreamer):
    def put(self, value):
        pass

    def end(self):
        pass


def _raises(field: str, call) -> str:
    """Run `call`; it must raise exactly HfspecError whose message names `field`. Returns the message."""
    with pytest.raises(HfspecError) as caught:
        call()
    assert type(caught.value) is HfspecError
    message = str(caught.value)
    assert field in message, message
    return message


# ------------------------------------------------------------------------------------------- hfspec.generate
API_CASES = {
    "nan scores, sampling": (dict(temperature=1, logits_processor=LogitsProcessorList([Fill(float("nan"))])),
                             "logits_processor"),
    "no token allowed, greedy": (dict(temperature=0, logits_processor=LogitsProcessorList([Fill(-float("inf"))])),
                                 "logits_processor"),
    "no token allowed, sampling": (dict(temperature=1, logits_processor=LogitsProcessorList([Fill(-float("inf"))])),
                                   "logits_processor"),
    "temperature 0 with do_sample": (dict(temperature=0, do_sample=True), "do_sample"),
    "temperature 0.7 without do_sample": (dict(temperature=0.7, do_sample=False), "do_sample"),
    "beam search": (dict(temperature=0, num_beams=2), "num_beams"),
    "output_scores": (dict(temperature=0, output_scores=True), "output_scores"),
    "streamer with a batch of 2": (dict(temperature=0, streamer=Sink(), input_ids=PROMPT.repeat(2, 1)), "streamer"),
    "temperature inf": (dict(temperature=float("inf")), "temperature"),
    "temperature nan": (dict(temperature=float("nan")), "temperature"),
    "seed 1.5": (dict(temperature=1, seed=1.5), "seed"),
    "seed 'abc'": (dict(temperature=1, seed="abc"), "seed"),
    "token id = vocabulary size": (dict(input_ids=torch.tensor([[0, 96]])), "input_ids"),
    "negative token id": (dict(input_ids=torch.tensor([[0, -1]])), "input_ids"),
    "row all padding": (dict(input_ids=torch.tensor([[2, 2, 2], [3, 4, 5]]),
                             attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]])), "attention_mask"),
    "return_dict_in_generate False": (dict(return_dict_in_generate=False), "return_dict_in_generate"),
    "stop_strings without tokenizer": (dict(temperature=0, stop_strings=["w"]), "stop_strings"),
    "plain through generate": (dict(temperature=0, plain=True), "plain"),  # was passed on, then hidden
    "draft_model through generate": (dict(temperature=0, draft_model=None), "draft_model"),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_generate_refuses_by_name(pair, case):
    kwargs, field = API_CASES[case]
    target, draft = pair
    args = dict(input_ids=PROMPT, draft=draft, gamma=3, max_new_tokens=6) | kwargs
    message = _raises(field, lambda: hfspec.generate(target, **args))
    if field == "logits_processor":
        assert "batch row 0 at sequence position 4" in message  # the first new token of the prompt's row


DROP_IN_CASES = {
    "beam search": (dict(num_beams=2), "num_beams"),
    "output_scores": (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
    "output_logits": (dict(output_logits=True, return_dict_in_generate=True), "output_logits"),
    "prompt lookup": (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
    "contrastive search": (dict(penalty_alpha=0.5, top_k=4), "penalty_alpha"),
    "streamer with a batch of 2": (dict(streamer=Sink(), input_ids=PROMPT.repeat(2, 1)), "streamer"),
    "seed 1.5": (dict(seed=1.5), "seed"),
    "token id = vocabulary size": (dict(input_ids=torch.tensor([[0, 96]])), "input_ids"),
    "nan scores": (dict(do_sample=True, logits_processor=LogitsProcessorList([Fill(float("nan"))])),
                   "logits_processor"),
}


@pytest.mark.parametrize("case", list(DROP_IN_CASES))
def test_drop_in_refuses_by_name(pair, case):
    kwargs, field = DROP_IN_CASES[case]
    target, draft = pair
    args = dict(input_ids=PROMPT, draft_model=draft, do_sample=False, max_new_tokens=6) | kwargs
    _raises(field, lambda: target.generate(custom_generate=hfspec.speculative_generate, **args))


def test_drop_in_assistant_model_is_refused(pair):
    target, draft = pair
    _raises("assistant_model", lambda: target.generate(PROMPT, custom_generate=hfspec.speculative_generate,
                                                       draft_model=draft, assistant_model=draft, max_new_tokens=4))


def test_good_options_still_pass(pair):
    """Negative control for the refusals: the same calls without the bad option decode."""
    target, draft = pair
    out = hfspec.generate(target, PROMPT, draft=draft, temperature=1, seed=7, max_new_tokens=6,
                          return_dict_in_generate=True, streamer=Sink())
    assert out.sequences.shape == (1, 10)
    batch = hfspec.generate(target, PROMPT.repeat(2, 1), draft=draft, temperature=1, seed=2**63, max_new_tokens=4)
    assert batch.sequences.shape[0] == 2
    plain = target.generate(PROMPT, custom_generate=hfspec.speculative_generate, draft_model=draft, do_sample=False,
                            max_new_tokens=6, output_scores=False)
    assert torch.equal(plain, target.generate(PROMPT, do_sample=False, max_new_tokens=6))


# ----------------------------------------------------------------------------------------------- stop strings
@pytest.fixture(scope="module")
def micro():
    target = load_model(MICRO, progress=False)
    return target, hfspec.make_draft(target, "rtn4"), load_tokenizer(MICRO)


def test_stop_strings_work_through_generate_and_the_drop_in(micro):
    target, draft, tok = micro
    ids = tok("The attention", return_tensors="pt").input_ids
    free = target.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    stop = tok.decode(free[0, ids.shape[1] + 4 :]).split()[0]  # a word the greedy text reaches after 4+ tokens
    expected = target.generate(ids, do_sample=False, max_new_tokens=24, stop_strings=[stop], tokenizer=tok)
    assert expected.shape[1] < free.shape[1], "negative control: the stop string must end the text early"
    out = hfspec.generate(target, ids, draft=draft, temperature=0, max_new_tokens=24, stop_strings=[stop],
                          tokenizer=tok)
    assert torch.equal(out.sequences, expected) and out.stats.stop_reasons == ["stop_criteria"]
    drop_in = target.generate(ids, custom_generate=hfspec.speculative_generate, draft_model=draft, do_sample=False,
                              max_new_tokens=24, stop_strings=stop, tokenizer=tok)
    assert torch.equal(drop_in, expected)


# ---------------------------------------------------------------------------------------------------- loading
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("four-layers")
    build("llama", layers=4).save_pretrained(path)
    return path


def _variant(folder: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "variant"
    shutil.copytree(folder, copy)
    change(copy)
    return copy


def _layers(n: int):
    def change(path: Path):
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(config | {"num_hidden_layers": n}))
    return change


def _cut(fraction: float):
    def change(path: Path):
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: int(len(data) * fraction)])
    return change


LOAD_CASES = {
    "config declares 6 layers over 4": (_layers(6), "model.layers.4."),
    "config declares 2 layers over 4": (_layers(2), "model.layers.2."),
    "truncated safetensors": (_cut(0.5), "model.safetensors"),
    "empty safetensors": (_cut(0.0), "model.safetensors"),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_loading_refuses_a_model_that_is_not_its_checkpoint(folder, tmp_path, case):
    change, tensor = LOAD_CASES[case]
    path = _variant(folder, tmp_path, change)
    message = _raises(tensor, lambda: load_model(path, progress=False, role="target"))
    assert message.startswith("target: ")


def test_loading_the_intact_folder_passes(folder):
    """Negative control: the folder the bad variants come from loads."""
    assert load_model(folder, progress=False).config.num_hidden_layers == 4


def test_missing_gguf_is_called_a_gguf_file(tmp_path):
    message = _raises("target", lambda: load_model(tmp_path / "model.gguf", role="target"))
    assert "no such GGUF file" in message and "no such folder" not in message


# ---------------------------------------------------------------------------------------- dashboard settings
SETTINGS_CASES = {
    "top_k '5'": ({"top_k": "5"}, "top_k"),
    "temperature nan": ({"temperature": float("nan")}, "temperature"),
    "temperature inf": ({"temperature": float("inf")}, "temperature"),
    "seed 1.5": ({"seed": 1.5}, "seed"),
    "seed 'abc'": ({"seed": "abc"}, "seed"),
    "max_new_tokens 2.0": ({"max_new_tokens": 2.0}, "max_new_tokens"),
    "top_p None": ({"top_p": None}, "top_p"),
    "target None": ({"target": None}, "target"),
    "chat 'no'": ({"chat": "no"}, "chat"),
    "device 'gpu'": ({"device": "gpu"}, "device"),
    "dtype 'int8'": ({"dtype": "int8"}, "dtype"),
}


@pytest.mark.parametrize("case", list(SETTINGS_CASES))
def test_settings_refuse_by_name(case):
    change, field = SETTINGS_CASES[case]
    good = RunSettings(target="x", prompt="hi")
    assert good.validated() is good
    _raises(field, lambda: replace(good, **change).validated())


# ------------------------------------------------------------------------------------------------------- CLI
CLI_CASES = {
    "run --temperature nan": (["run", "--temperature", "nan"], "temperature"),
    "run --temperature inf": (["run", "--temperature", "inf"], "temperature"),
    "sweep --csv unwritable": (["sweep", "--csv", "{missing}/rows.csv"], "--csv"),
    "sweep --plot unwritable": (["sweep", "--plot", "{missing}/plot.png"], "--plot"),
    "sweep --plot unknown format": (["sweep", "--plot", "{tmp}/plot.xyz"], "--plot"),
    "compare --csv a folder": (["compare", "--drafts", "rtn4", "--csv", "{tmp}"], "--csv"),
    "compare --repeats 0": (["compare", "--drafts", "rtn4", "--repeats", "0"], "repeats"),
    "bench --repeats 0": (["bench", "--repeats", "0"], "repeats"),
    "compare --drafts ','": (["compare", "--drafts", ","], "drafts"),
    "sweep --drafts ' , '": (["sweep", "--drafts", " , "], "drafts"),
    "run --seed -1": (["run", "--seed", "-1"], "seed"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_refuses_with_one_line_and_exit_code_2(capsys, tmp_path, case):
    argv, field = CLI_CASES[case]
    argv = [a.format(missing=tmp_path / "no-such-folder", tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hfspec: error: ") and field in lines[0], captured.err
    assert captured.out == ""
