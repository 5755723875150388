"""Loading and generating from several threads at once gives what one thread gives alone.

transformers replaces `PreTrainedModel.tie_weights` on the class while it loads; two overlapping loads restored
it in the wrong order and left `lm_head` on the meta device and untied. `load_model` serialises loads and checks
each loaded model (`check_loaded`)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import build, build_family

import hfspec
from hfspec.errors import HfspecError
from hfspec.io.loading import check_loaded, load_model
from hfspec.session import RunSettings, Session

PROMPT = torch.tensor([[0, 5, 17, 33]])
THREADS = 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    """Four checkpoints: two with tied embeddings (gpt2, gemma), two without (llama, qwen2)."""
    models = [build("gpt2", seed=0, init=0.2), build_family("gemma", seed=1, init=0.2),
              build("llama", seed=2, init=0.2), build("qwen2", seed=3, init=0.2)]
    paths = []
    for i, model in enumerate(models):
        path = tmp_path_factory.mktemp(f"model{i}")
        model.save_pretrained(path)
        paths.append(path)
    return paths


def load_and_generate(path: Path, seed: int) -> tuple[torch.Tensor, bool]:
    target = load_model(path, progress=False)
    draft = hfspec.make_draft(target, "rtn4")
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=3, temperature=1.0, seed=seed, max_new_tokens=12)
    tied = target.get_output_embeddings().weight is target.get_input_embeddings().weight
    return out.sequences, tied


def in_threads(work, count: int) -> list:
    """Run work(i) for i < count, all threads released at once; re-raise the first failure."""
    results: list = [None] * count
    errors: list = []
    barrier = threading.Barrier(count)

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def test_four_threads_load_and_generate_like_one(folders):
    sequential = [load_and_generate(path, seed=i) for i, path in enumerate(folders)]
    assert [tied for _, tied in sequential] == [True, True, False, False]
    parallel = in_threads(lambda i: load_and_generate(folders[i], seed=i), THREADS)
    for (seq_out, seq_tied), (par_out, par_tied) in zip(sequential, parallel, strict=True):
        assert torch.equal(par_out, seq_out)
        assert par_tied == seq_tied
    assert len({tuple(out[0].tolist()) for out, _ in sequential}) == THREADS  # the four runs differ


def test_loads_never_overlap(folders, monkeypatch):
    """Inside load_model at most one from_pretrained runs at a time, however the threads interleave."""
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__
    inside, most = [0], [0]
    guard = threading.Lock()

    def counting(cls, *args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            threading.Event().wait(0.02)  # widen the window in which an unserialised load would overlap
            return original(cls, *args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    in_threads(lambda i: load_model(folders[i % len(folders)], progress=False), THREADS)
    assert most[0] == 1


def test_check_loaded_names_an_untied_or_meta_tensor(folders):
    """What a racing load leaves behind is refused by name (negative control: the intact model passes)."""
    model = load_model(folders[0], progress=False)
    check_loaded(model, {}, "target", "x")
    untied = load_model(folders[0], progress=False)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    with pytest.raises(HfspecError, match="target: tensor lm_head.weight .* should be tied .* another thread"):
        check_loaded(untied, {}, "target", "x")
    on_meta = load_model(folders[2], progress=False)
    on_meta.lm_head.weight = torch.nn.Parameter(torch.empty_like(on_meta.lm_head.weight, device="meta"))
    with pytest.raises(HfspecError, match="target: tensor lm_head.weight .* meta device"):
        check_loaded(on_meta, {}, "target", "x")


@pytest.mark.slow
def test_cold_sessions_in_two_threads_run_like_one():
    """Two dashboard sessions starting cold at once (each loads the micro pair) give the sequential text."""
    settings = [RunSettings.from_preset("micro-rtn4", max_new_tokens=8, seed=seed, measure_baseline=False,
                                        ignore_eos=True) for seed in (1, 2)]
    sequential = [Session().run(s).text for s in settings]
    assert in_threads(lambda i: Session().run(settings[i]).text, 2) == sequential
