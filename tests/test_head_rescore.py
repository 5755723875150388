"""The RTN draft's LM head: a large quantised head's top logits re-scored with the target's own head rows
(`head_top`), a small head kept as the target's, and the output still distributed exactly as the target's."""

from pathlib import Path

import laws
import pytest
import torch
import torch.nn.functional as F
from laws import WRONG_RULES
from tiny_models import build

import hfspec
import hfspec.decoding.sampling as sampling
from hfspec.drafts import describe, make_draft
from hfspec.drafts.fidelity import fidelity, probe_ids
from hfspec.errors import HfspecError
from hfspec.io.loading import load_model
from hfspec.kernels.lean import HEAD_FLOAT_BELOW, HEAD_TOP

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"

IDS = torch.tensor([[0, 5, 9, 3, 7, 11, 4]])


def wide_head_model(seed: int = 0):
    """A Llama whose untied head has HEAD_FLOAT_BELOW weights or more (so the default re-scores it)."""
    model = build("llama", vocab=HEAD_FLOAT_BELOW // 64, hidden=64, layers=1, seed=seed, init=0.2)
    assert model.get_output_embeddings().weight.numel() >= HEAD_FLOAT_BELOW
    return model


def test_a_large_head_is_rescored_by_default_and_only_its_top_logits_change():
    target = wide_head_model()
    plain, rescored = make_draft(target, "rtn4", head_top=0), make_draft(target, "rtn4")
    assert rescored.head_top == HEAD_TOP and plain.head_top == 0
    assert "top 32 logits re-scored" in describe(rescored)["step"]
    with torch.no_grad():
        a = plain(input_ids=IDS).logits[0]
        b = rescored(input_ids=IDS).logits[0]
    changed = (a != b).sum(-1)
    assert (changed <= HEAD_TOP).all() and (changed > 0).all()
    # the changed entries are each position's largest quantised logits
    top = a.topk(HEAD_TOP, dim=-1).indices
    unchanged = torch.ones_like(a, dtype=torch.bool).scatter(-1, top, False)
    assert torch.equal(a[unchanged], b[unchanged])


def test_rescoring_computes_the_target_head_rows_exactly():
    target = wide_head_model()
    draft = make_draft(target, "rtn4", head_top=16)
    x = torch.randn(3, 64)
    quantised = draft._head_mm(x)
    out = draft._rescored(x, quantised)
    top = quantised.topk(16, dim=-1).indices
    exact = F.linear(x, target.get_output_embeddings().weight)
    assert torch.allclose(out.gather(-1, top), exact.gather(-1, top), atol=1e-5)
    assert not torch.allclose(quantised.gather(-1, top), exact.gather(-1, top), atol=1e-3)  # it did change


def test_rescoring_brings_a_trained_models_draft_closer_to_it():
    """On the embedded micro model (trained; its head is small, so re-scoring is asked for explicitly)."""
    target = load_model(str(MICRO), progress=False)
    ids = probe_ids(target, 64)
    plain = fidelity(target, make_draft(target, "rtn4", head_top=0), ids)
    rescored = fidelity(target, make_draft(target, "rtn4", head_top=32), ids)
    own_head = fidelity(target, make_draft(target, "rtn4"), ids)  # the default for a small head: the target's
    assert rescored > plain + 0.005 and own_head > plain + 0.005


def test_a_small_head_is_the_targets_own_and_head_top_0_keeps_the_old_quantised_head():
    target = build("llama")  # 96 × 32 head
    default, old = make_draft(target, "rtn4"), make_draft(target, "rtn4", head_top=0)
    head = target.get_output_embeddings().weight
    assert default.head.bits is None and default.head.weight.data_ptr() == head.data_ptr()
    assert "target's own head" in describe(default)["step"]
    assert old.head.bits == 4 and "head" not in describe(old)["step"].split(";")[-1]
    with torch.no_grad():
        h = torch.randn(2, 32)
        assert torch.allclose(default._head_mm(h), F.linear(h, head), atol=1e-6)


def test_greedy_text_with_a_rescored_draft_is_the_targets():
    target = wide_head_model(seed=2)
    want = target.generate(IDS, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    got = hfspec.generate(target, IDS, draft=make_draft(target, "rtn2", head_top=8), gamma=4, max_new_tokens=24,
                          min_new_tokens=24)
    assert torch.equal(got.sequences, want)


@pytest.mark.parametrize("bad", [-1, 1025, 2.5, True, "32"])
def test_bad_head_top_is_refused_naming_the_field(bad):
    with pytest.raises(HfspecError, match="head_top.*0..1024"):
        make_draft(build("llama"), "rtn4", head_top=bad)


def test_head_top_without_the_lean_step_is_refused():
    with pytest.raises(HfspecError, match="head_top"):
        make_draft(build("llama"), "rtn4", head_top=8, lean=False)
    with pytest.raises(HfspecError, match="head_top"):
        make_draft(build("gpt2"), "rtn4", head_top=8)  # GPT-2 has no lean step
    make_draft(build("gpt2"), "rtn4", head_top=0)  # nothing to re-score: allowed


# ---- T > 0: exact with a re-scored head (its q is a different function of the context, used to draw and accept)

V, NEW, ROWS = 8, 3, 20_000


@pytest.fixture(scope="module")
def rescored_pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)
    return target, make_draft(target, "rtn2", head_top=2)


def run(target, draft, prompt, seed):
    ids = torch.tensor([prompt] * ROWS)
    out = hfspec.generate(target, ids, draft=draft, gamma=3, max_new_tokens=NEW, min_new_tokens=NEW, seed=seed,
                          pad_token_id=2, temperature=1.0)
    return out.sequences[:, len(prompt):], out.stats


@pytest.mark.slow
def test_a_rescored_draft_samples_the_targets_law(rescored_pair):
    target, draft = rescored_pair
    with torch.no_grad():
        a = make_draft(target, "rtn2", head_top=0)(input_ids=torch.tensor([[0, 3]])).logits
        b = draft(input_ids=torch.tensor([[0, 3]])).logits
    assert not torch.allclose(a, b), "the re-scored head must change q for this test to mean anything"
    samples, stats = run(target, draft, [0, 3], seed=11)
    assert 0.05 < stats.alpha < 0.95
    assert laws.p_value(samples, laws.exact_law(target, [0, 3], V, NEW), V, NEW) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", list(WRONG_RULES))
def test_negative_control_wrong_rule_with_a_rescored_draft_fails(rescored_pair, monkeypatch, rule):
    target, draft = rescored_pair
    name, wrong = WRONG_RULES[rule]
    monkeypatch.setattr(sampling, name, wrong)
    samples, _ = run(target, draft, [0, 3], seed=11)
    assert laws.p_value(samples, laws.exact_law(target, [0, 3], V, NEW), V, NEW) < 1e-6


@pytest.mark.slow
def test_a_compiled_step_rescores_its_head_as_the_eager_step_does(tmp_path, monkeypatch):
    from hfspec.kernels import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", tmp_path)  # never the user's ~/.cache
    target = build("llama", init=0.1)
    fast, eager = make_draft(target, "rtn4-compiled", head_top=8), make_draft(target, "rtn4", head_top=8)
    assert fast.compiled_step is not None and "top 8 logits re-scored" in describe(fast)["step"]
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(0))

    def steps(draft):
        cache = draft.hfspec_new_cache()
        draft.logits(ids[:, :8], None, None, cache, 1)
        return torch.cat([draft.logits(ids[:, i:i + 1], None, None, cache, 1) for i in range(8, 20)], 1)

    got, want = steps(fast), steps(eager)
    assert (got - want).abs().max() <= 2 ** -6 * max(1.0, float(want.abs().max()))
    unscored = steps(make_draft(target, "rtn4", head_top=0))
    assert (unscored - want).abs().max() > 1e-3  # re-scoring changed the logits the two steps agree on


# ------------------------------------------------------------------------------------------------ the -topK spec
def test_the_top_spec_part_sets_head_top_everywhere_a_spec_goes(capsys):
    from hfspec.cli import main
    from hfspec.drafts.registry import parse

    assert parse("rtn4-top0").label == "rtn4-g32-top0"
    assert parse("rtn3-g64-top64-compiled").label == "rtn3-g64-top64-compiled"
    assert parse(parse("rtn4-top8").label).param("head_top") == 8  # the label reads back
    target = wide_head_model()
    assert make_draft(target, "rtn4-top0").head_top == 0 and make_draft(target, "rtn4-top8").head_top == 8
    assert make_draft(target, "rtn4").head_top == HEAD_TOP  # control: no -top, the default
    assert make_draft(target, "rtn4-top8", head_top=8).head_top == 8  # the same value twice is fine
    with pytest.raises(HfspecError, match="says head_top=8 and the option says head_top=0"):
        make_draft(target, "rtn4-top8", head_top=0)
    # on micro (a small head: the target's own by default) -top32 asks for the quantised head re-scored
    micro = load_model(str(MICRO), progress=False)
    assert make_draft(micro, "rtn4").head_top == 0 and make_draft(micro, "rtn4-top32").head_top == 32
    # through the CLI: the run reports the draft it built
    code = main(["run", "--target", str(MICRO), "--draft", "rtn4-top0", "--max-new-tokens", "8", "--no-baseline"])
    captured = capsys.readouterr()
    assert code == 0 and "building draft rtn4-g32-top0" in captured.err, captured.err


@pytest.mark.parametrize("bad, says", [("rtn4-top2000", "-topK .* must be 0..1024, got 2000"),
                                       ("rtn4-topx", "cannot read 'rtn4-topx'"),
                                       ("rtn4-compiled-top3", "optionally -topK, optionally ending in -compiled")])
def test_a_bad_top_spec_is_refused_naming_it(bad, says):
    with pytest.raises(HfspecError, match=says):
        make_draft(wide_head_model(), bad)


def test_export_refuses_a_top_spec():
    from hfspec.io.export_draft import check_exportable

    with pytest.raises(HfspecError, match="rtn4-g32-top0 cannot be exported: -topK"):
        check_exportable("rtn4-top0")
    assert check_exportable("rtn4").label == "rtn4-g32"  # control


def test_the_form_values_keep_the_top_part():
    """The dashboard's draft form reads and writes specs through these: -topK must survive the round trip."""
    from hfspec.settings import draft_spec, split_draft_spec

    values = split_draft_spec("rtn4-g64-top0-compiled")
    assert values["head_top"] == 0
    kind = values.pop("kind")
    assert draft_spec(kind, **values) == "rtn4-g64-top0-compiled"
    plain = split_draft_spec("rtn4")
    assert plain["head_top"] == "default" and draft_spec(plain.pop("kind"), **plain) == "rtn4"  # control
