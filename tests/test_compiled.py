"""The compiled one-token draft step (`rtn4-compiled`): it computes the eager lean step, decodes exactly, keeps
each draft's own weights, survives a broken on-disk artefact, and falls back (saying why) when compiling fails.

Compiling costs seconds per model, so the models here are few and tiny, and one inductor cache folder is shared
by the module (later compiles of the same graph shape hit it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from tiny_models import build, build_family, sharpen

import hfspec
from hfspec.drafts import describe, make_draft, registry
from hfspec.errors import HfspecError
from hfspec.kernels import compiled, int4_rows
from hfspec.kernels.lean import LeanDecoder
from hfspec.kernels.lean_cache import CACHE_CHUNK

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"


def _steps(draft: LeanDecoder, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits of each token after `prompt`, fed one at a time (the compiled path when the draft has one)."""
    cache = draft.hfspec_new_cache()
    draft.logits(ids[:, :prompt], None, None, cache, 1)
    return torch.cat([draft.logits(ids[:, i:i + 1], None, None, cache, 1) for i in range(prompt, ids.shape[1])], 1)


def _pairs(draft: LeanDecoder, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits of every second token after `prompt`, fed two at a time (a compiled draft's pair step)."""
    cache = draft.hfspec_new_cache()
    draft.logits(ids[:, :prompt], None, None, cache, 1)
    return torch.cat([draft.logits(ids[:, i:i + 2], None, None, cache, 1)
                      for i in range(prompt, ids.shape[1] - 1, 2)], 1)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    # the int4 kernel returns bf16 (8 significant bits): a different summation order may flip its last bit
    assert (got - want).abs().max() <= 2 ** -6 * max(1.0, float(want.abs().max()))
    assert float(torch.minimum(got.softmax(-1), want.softmax(-1)).sum(-1).min()) >= 0.99


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_compiled_step_computes_the_eager_lean_step(family, own_cache):
    target = sharpen(build_family(family, init=0.1), 6.0)
    fast = make_draft(target, "rtn4-compiled")
    eager = make_draft(target, "rtn4")
    assert fast.compiled_step is not None and describe(fast)["step"].endswith("one-token step compiled (C++ wrapper)")
    assert eager.compiled_step is None
    # past the first cache chunk (the cache length is a dynamic dimension of the one graph) and, for gemma3,
    # past the sliding window of 8
    ids = torch.randint(3, 96, (1, CACHE_CHUNK + 12), generator=torch.Generator().manual_seed(0))
    got, want = _steps(fast, ids, CACHE_CHUNK - 4), _steps(eager, ids, CACHE_CHUNK - 4)
    _close(got, want)
    # two tokens a call (a round's catch-up), across the same cache growth and window
    assert fast.compiled_step.fn_pair is not None
    _close(_pairs(fast, ids, CACHE_CHUNK - 5), _pairs(eager, ids, CACHE_CHUNK - 5))
    # negative control: a different model's compiled step is far from this one
    other = make_draft(sharpen(build_family(family, init=0.1, seed=5), 6.0), "rtn4-compiled")
    assert (_steps(other, ids, CACHE_CHUNK - 4) - want).abs().max() > 0.1
    # and compiling `other` did not change what `fast` runs (each draft has its own compiled code)
    assert torch.equal(_steps(fast, ids, CACHE_CHUNK - 4), got)


@pytest.mark.slow
def test_compiled_draft_decodes_the_targets_greedy_text(own_cache):
    from hfspec.io.loading import load_model

    target = load_model(str(MICRO), dtype="float32", progress=False)
    draft = make_draft(target, "rtn4-compiled")
    ids = torch.tensor([[0, 5, 9, 40]])
    kw = dict(temperature=0.0, max_new_tokens=40, min_new_tokens=40)
    spec = hfspec.generate(target, ids, draft, gamma=4, **kw)
    plain = hfspec.plain_generate(target, ids, **kw)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.alpha > 0.5  # the compiled draft is a close proposal, not just an exact one


def test_the_compile_check_allows_bf16_rounding_and_refuses_a_wrong_step():
    torch.manual_seed(0)
    want = (torch.randn(1, 1, 4096) * 12).to(torch.bfloat16).float()  # logits as a bf16 kernel returns them
    # the same sums in another order: about one entry in fifteen one bf16 step away (as measured on an AVX2 CPU)
    nudged = want.clone()
    step = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.floor(torch.log2(want.abs().clamp_min(1e-30)))
    moved = torch.rand(want.shape) < 1 / 15
    nudged[moved] += step[moved]
    assert float((nudged - want).abs().max()) >= 0.06  # over the old absolute 1e-3 by far
    assert compiled.step_difference(nudged, want) == ""
    # a logit near 0 moved by a rounding of the row's scale (a sum of large terms that cancel), as on an AMX CPU
    small = int(want.abs().argmin())
    cancelled = want.clone()
    cancelled[0, 0, small] += 2 ** -9 * float(want.abs().max())
    assert compiled.step_difference(cancelled, want) == ""
    # negative controls: a step that is wrong by 5 % at its largest logit or by 2 % of the scale near 0, a swapped
    # pair of logits, another shape
    wrong = want.clone()
    top = int(want.abs().argmax())
    wrong[0, 0, top] *= 1.05
    assert f"logit {top} is" in compiled.step_difference(wrong, want)
    drifted = want.clone()
    drifted[0, 0, small] += 0.02 * float(want.abs().max())
    assert f"logit {small} is" in compiled.step_difference(drifted, want)
    swapped = want.clone()
    swapped[0, 0, [1, 2]] = want[0, 0, [2, 1]] + 1.0
    assert compiled.step_difference(swapped, want)
    assert "shape" in compiled.step_difference(want[..., :10], want)


def test_a_failed_compile_keeps_the_eager_step_and_says_why(own_cache, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    target = build("llama")
    messages = []
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        draft = make_draft(target, "rtn4-compiled", progress=messages.append)
    assert draft.compiled_step is None
    assert "one-token step eager (compile failed: RuntimeError: no C++ compiler)" in describe(draft)["step"]
    assert any("compile failed" in m for m in messages)
    ids = torch.tensor([[0, 5, 9]])
    kw = dict(temperature=0.0, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)


@pytest.mark.slow
def test_a_compile_that_fails_only_with_the_cpp_wrapper_is_redone_without_it(tmp_path, monkeypatch):
    from hfspec.kernels.compiled import NO_WRAPPER_MARKER, CompiledStep

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", tmp_path)  # its own folder: the marker must not reach other tests

    original = CompiledStep._compile_once
    tried = []

    def no_wrapper_here(self, no_cache, wrapper):
        tried.append(wrapper)
        if wrapper:
            raise RuntimeError("cannot build the C++ wrapper")
        return original(self, no_cache, wrapper)

    monkeypatch.setattr(CompiledStep, "_compile_once", no_wrapper_here)
    target = build("llama")
    messages = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning: the draft is compiled
        draft = make_draft(target, "rtn4-compiled", progress=messages.append)
    assert tried == [True, True, False]  # as cached, afresh, afresh without the wrapper
    assert draft.compiled_step is not None and not draft.compiled_step.wrapper
    assert describe(draft)["step"].endswith("one-token step compiled")
    assert any("cannot build the C++ wrapper" in m and "without the C++ wrapper" in m for m in messages)
    assert "cannot build the C++ wrapper" in (tmp_path / NO_WRAPPER_MARKER).read_text()
    tried.clear()  # the next build in this folder does not try the wrapper again
    assert make_draft(target, "rtn4-compiled").compiled_step is not None and tried == [False]
    ids = torch.tensor([[0, 5, 9]])
    kw = dict(temperature=0.0, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)


_BUILD = textwrap.dedent("""
    import torch, hfspec
    from hfspec.io.loading import load_model
    target = load_model(%r, dtype="float32", progress=False)
    draft = hfspec.make_draft(target, "rtn4-compiled", progress=print)
    ids = torch.tensor([[0, 5, 9, 40]])
    kw = dict(temperature=0.0, max_new_tokens=24, min_new_tokens=24)
    same = torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)
    print("PATH", hfspec.drafts.describe(draft)["step"].rsplit("one-token step ", 1)[1], "SAME", same)
""") % str(MICRO)


@pytest.mark.slow
def test_a_truncated_artefact_on_disk_does_not_break_the_next_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["HFSPEC_COMPILE_DIR"] = str(tmp_path)

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", _BUILD], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    first = run()
    assert "PATH compiled (C++ wrapper) SAME True" in first
    libraries = list(tmp_path.rglob("*.so"))
    assert libraries, "inductor kept no compiled library on disk"
    for library in libraries:  # what a compile killed midway can leave behind
        library.write_bytes(library.read_bytes()[: library.stat().st_size // 3])
    second = run()
    assert "compiling afresh, without cached artefacts" in second and "PATH compiled (C++ wrapper) SAME True" in second
    third = run()  # the fresh artefacts were kept
    assert "compiling afresh" not in third and "PATH compiled (C++ wrapper) SAME True" in third


def test_compiled_spec_reads_labels_and_refuses_what_cannot_compile():
    parsed = registry.parse("rtn4-compiled")
    assert parsed.label == "rtn4-g32-compiled" and parsed.param("step") == "compiled"
    assert registry.fields_of("rtn3-g64-compiled")["step"] == "compiled"
    assert registry.fields_of("rtn3")["step"] == "eager"
    assert registry.spec_of("rtn", {"bits": 4, "group": 32, "step": "compiled"}) == "rtn4-compiled"
    with pytest.raises(HfspecError, match="step must be one of eager, compiled"):
        registry.spec_of("rtn", {"bits": 4, "group": 32, "step": "jit"})
    with pytest.raises(HfspecError, match="compiled step needs the lean step"):
        make_draft(build("llama"), "rtn4-compiled", lean=False)
    with pytest.raises(HfspecError, match="GPT2LMHeadModel cannot take"):
        make_draft(build("gpt2"), "rtn4-compiled")


@pytest.mark.parametrize("kind", ["file", "inside a file"])
def test_an_unusable_compile_folder_falls_back_with_the_full_disk_warning(tmp_path, monkeypatch, kind):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the compile folder should be")
    folder = blocker if kind == "file" else blocker / "inductor"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", folder)
    target = build("llama")
    messages = []
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*compile folder .*unusable"):
        draft = make_draft(target, "rtn4-compiled", progress=messages.append)
    assert draft.compiled_step is None and "one-token step eager (compile failed: " in describe(draft)["step"]
    assert any("using the eager lean step" in m for m in messages)
    assert blocker.read_text() == "a file where the compile folder should be"  # nothing of the user's removed
    ids = torch.tensor([[0, 5, 9]])
    kw = dict(temperature=0.0, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)


def test_the_artefact_is_shared_across_thread_counts_and_the_build_warms_every_path(own_cache, monkeypatch):
    """The dashboard runs torch with a thread fewer than the CLI: the same draft must load, not recompile. And a
    built draft's first decode calls nothing that compiles."""
    from torch._dynamo.utils import counters

    target = build("llama", seed=3)
    threads = torch.get_num_threads()
    checked_with_torchs_kernel = []
    as_compiled = int4_rows.as_compiled

    def spy():  # the compile check's eager step must run the compiled step's int4 kernel (torch's), not hfspec's
        checked_with_torchs_kernel.append(True)
        return as_compiled()

    monkeypatch.setattr(int4_rows, "as_compiled", spy)
    try:
        torch.set_num_threads(1)
        make_draft(target, "rtn4-compiled")
        torch._dynamo.reset()
        counters.clear()
        torch.set_num_threads(2)
        draft = make_draft(target, "rtn4-compiled")
    finally:
        torch.set_num_threads(threads)
    assert draft.compiled_step is not None and len(checked_with_torchs_kernel) == 4  # one-token and pair, twice
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1 and counters["inductor"]["fxgraph_cache_miss"] == 0
    compiles = dict(counters["stats"])
    ids = torch.tensor([[0, 5, 9, 40]])
    kw = dict(temperature=0.0, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)
    assert dict(counters["stats"]) == compiles, "decoding compiled something the build had not"


def test_a_compiled_4bit_step_is_checked_against_the_kernel_it_runs(own_cache):
    """hfspec's int4 kernel (fp32 activations) runs the eager step and torch's (bf16 activations) the compiled one.
    Over a few sharpened layers the two differ by more than the miscompile check allows (the control below), so the
    check must compare the compiled step with an eager step on torch's kernel, or every compiled 4-bit draft of a
    real-sized model decodes eagerly (as it did for a stop, unnoticed)."""
    target = sharpen(build("llama", vocab=512, layers=4, hidden=128, init=0.1), 6.0)
    draft = make_draft(target, "rtn4-compiled")
    assert draft.compiled_step is not None, describe(draft)["step"]
    assert describe(draft)["step"].endswith("one-token step compiled (C++ wrapper)")
    if int4_rows.function() is not None:  # the control: the two kernels' eager steps differ beyond the check
        ids, slot = torch.full((1, 1), 5, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        cache = draft.hfspec_new_cache()
        cache.reserve(1, 2)
        tables = draft.rotary_tables(1)
        ours = draft.one_token(ids, slot, tables, cache.keys, cache.values)
        with int4_rows.as_compiled():
            torchs = draft.one_token(ids, slot, tables, cache.keys, cache.values)
        assert compiled.step_difference(ours, torchs)


def test_a_two_token_catch_up_is_one_compiled_call_with_the_eager_steps_logits(own_cache):
    """After a round that kept every proposal the draft feeds its last token and the target's bonus token: one
    compiled call (`CompiledStep.pair`), giving what the eager lean step gives for the second of them. Feeds of
    one, three or four tokens stay one-token steps."""
    target = sharpen(build("llama", seed=4, init=0.1), 6.0)
    fast, eager = make_draft(target, "rtn4-compiled"), make_draft(target, "rtn4")
    step = fast.compiled_step
    assert step is not None and step.pair_path == "compiled"
    shown = describe(fast)  # what runs a catch-up and a tree level is said, not only the one-token step
    assert shown["pair"] == "compiled" and shown["tree_level"] == step.tree_level.path == "not compiled yet"
    assert "pair" not in describe(eager) and "tree_level" not in describe(eager)
    pairs, steps = [], []
    pair_fn, one_fn = step.fn_pair, step.fn
    step.fn_pair = lambda *args: pairs.append(1) or pair_fn(*args)
    step.fn = lambda *args: steps.append(1) or one_fn(*args)
    ids = torch.randint(3, 96, (1, 41), generator=torch.Generator().manual_seed(1))
    got = _pairs(fast, ids, 9)
    assert len(pairs) == 16 and not steps and got.shape[:2] == (1, 16)
    _close(got, _pairs(eager, ids, 9))
    cache = fast.hfspec_new_cache()
    fast.logits(ids[:, :9], None, None, cache, 1)
    for width in (1, 3, 4):
        fast.logits(ids[:, cache.length:cache.length + width], None, None, cache, 1)
    assert len(pairs) == 16 and len(steps) == 8
    # negative control: a pair's logits are its second token's, not its first's
    cache = eager.hfspec_new_cache()
    eager.logits(ids[:, :9], None, None, cache, 1)
    assert (eager.logits(ids[:, 9:10], None, None, cache, 1) - got[:, :1]).abs().max() > 0.1


def test_a_pair_step_that_cannot_compile_leaves_the_one_token_step(own_cache, monkeypatch):
    checked = compiled.CompiledStep._checked

    def broken(self, name, *args):  # the pair's compile fails; the one-token step's (the same method at T = 1) not
        if name == "tokens":
            raise RuntimeError("no pairs today")
        return checked(self, name, *args)

    monkeypatch.setattr(compiled.CompiledStep, "_checked", broken)
    target = build("llama", seed=6)
    draft = make_draft(target, "rtn4-compiled")
    assert draft.compiled_step is not None and draft.compiled_step.fn_pair is None
    assert draft.compiled_step.pair_path.startswith("one-token steps (")  # dynamo reports the error its own way
    ids = torch.tensor([[0, 5, 9]])
    kw = dict(temperature=0.0, max_new_tokens=16, min_new_tokens=16)
    assert torch.equal(hfspec.generate(target, ids, draft, **kw).sequences,
                       hfspec.plain_generate(target, ids, **kw).sequences)
