"""bf16 / fp16 targets with lean and compiled drafts, the draft's bytes beside a bf16 target, and the memory check
that refuses a checkpoint too big for the machine before loading it."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build, build_family, perturbed, sharpen
from transformers import LlamaConfig, LlamaForCausalLM

import hfspec
from hfspec.attrs import PACKED, get_attr
from hfspec.drafts import describe, make_draft, weight_bytes
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.io.loading import load_model
from hfspec.kernels import fast_linear
from hfspec.kernels.lean import LeanDecoder

HALF = [torch.bfloat16, torch.float16]
FAMILIES = ["llama", "qwen3", "gemma3"]


def _target(family: str, dtype: torch.dtype, seed: int = 0):
    return sharpen(build_family(family, init=0.1, seed=seed), 6.0).to(dtype)


def _ids(n: int = 24) -> torch.Tensor:
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(0))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.minimum(a.float().softmax(-1), b.float().softmax(-1)).sum(-1).mean())


def _hf_reference(target, spec: str):
    """The HF-forward RTN draft reading the target's own embedding rows, as the lean draft does."""
    hf = make_draft(target, spec, lean=False)
    hf.model.embed_tokens = target.model.embed_tokens
    return hf


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_float_lean_step_of_a_half_target_computes_its_forward(family, dtype):
    target = _target(family, dtype)
    ids = _ids()
    with torch.no_grad():
        ref = target(ids).logits
    got = LeanDecoder(target, bits=None)(ids).logits
    assert got.dtype == torch.float32  # q is formed in fp32 whatever the target's dtype
    # the HF forward rounds every activation to 8 (bf16) or 11 (fp16) bits, the lean step keeps fp32
    # activations: they agree to the half type's rounding, not bit for bit
    tol = (2 ** -4 if dtype == torch.bfloat16 else 2 ** -7) * max(1.0, float(ref.abs().max()))
    assert (got - ref.float()).abs().max() <= tol
    assert _overlap(got, ref) >= 0.98
    # negative control: another model of the family is well outside that tolerance
    with torch.no_grad():
        other = _target(family, dtype, seed=3)(ids).logits
    assert (other.float() - ref.float()).abs().max() > 4 * tol


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_lean_rtn4_of_a_half_target_matches_the_hf_forward_rtn4(family, dtype):
    target = _target(family, dtype)
    ids = _ids()
    lean = make_draft(target, "rtn4", head_top=0)  # as the HF path: a quantised head
    hf = _hf_reference(target, "rtn4")
    assert isinstance(lean, LeanDecoder) and not isinstance(hf, LeanDecoder)
    assert f"for a {str(dtype).replace('torch.', '')} target" in describe(lean)["step"]
    with torch.no_grad():
        q_lean, q_hf = lean(ids).logits, hf(ids).logits
    assert q_lean.dtype == torch.float32
    assert _overlap(q_lean, q_hf) >= 0.95
    other = make_draft(_target(family, dtype, seed=3), "rtn4", head_top=0)
    with torch.no_grad():
        assert _overlap(other(ids).logits, q_hf) < _overlap(q_lean, q_hf) - 0.1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_compiled_step_of_a_half_target_computes_the_eager_step(dtype, tmp_path, monkeypatch):
    from hfspec.kernels import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", tmp_path)
    target = _target("llama", dtype)
    fast, eager = make_draft(target, "rtn4-compiled"), make_draft(target, "rtn4")
    assert fast.compiled_step is not None
    ids = _ids(40)
    steps = {}
    for name, draft in (("fast", fast), ("eager", eager)):
        cache = draft.hfspec_new_cache()
        draft.logits(ids[:, :30], None, None, cache, 1)
        steps[name] = torch.cat([draft.logits(ids[:, i:i + 1], None, None, cache, 1) for i in range(30, 40)], 1)
    got, want = steps["fast"], steps["eager"]
    assert got.dtype == torch.float32
    assert (got - want).abs().max() <= 2 ** -6 * max(1.0, float(want.abs().max()))


def _wide_llama(dtype: torch.dtype) -> LlamaForCausalLM:
    """Matrices big enough for the int4 kernel (the draft's real storage), tied embeddings like SmolLM2 and a head of 2^20
    weights, quantised like a real vocabulary's (smaller heads are the target's own)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval().to(dtype)


def test_a_bf16_targets_rtn4_draft_holds_under_a_third_of_its_bytes():
    target = _wide_llama(torch.bfloat16)
    draft = make_draft(target, "rtn4")
    ratio = weight_bytes(draft) / weight_bytes(target)
    # 4-bit codes plus a bf16 scale and zero per 32 weights: 5 of 16 bits; norms and rotary tables add a little
    assert 0.25 <= ratio <= 0.32, ratio
    # the input rows come from the target's table itself: no copy
    assert draft.embed_table.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    # control: the same draft holding its own bf16 copy of the table is well over the bound
    assert (weight_bytes(draft) + target.model.embed_tokens.weight.nbytes) / weight_bytes(target) > 0.5


def test_draft_build_reports_layer_progress(monkeypatch):
    from hfspec.kernels import lean

    monkeypatch.setattr(lean, "BUILD_PROGRESS_EVERY", 0.0)
    messages: list[str] = []
    make_draft(_wide_llama(torch.bfloat16), "rtn4", progress=messages.append)
    assert messages[-1].startswith("building the draft: layer 2/2")


# ------------------------------------------------------------------------------------------------ memory
@pytest.fixture
def saved_folder(tmp_path):
    model = _wide_llama(torch.bfloat16)
    model.save_pretrained(tmp_path)
    return tmp_path, sum(p.numel() for p in model.parameters())


def test_a_checkpoint_too_big_for_memory_is_refused_before_loading(saved_folder, monkeypatch):
    folder, params = saved_folder
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained called although the model cannot fit")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setenv(memory.ENV, "1MiB")
    with pytest.raises(HfspecError, match=r"target: .* needs about .* GiB of memory in its saved dtype \(bfloat16\)"
                                          r".*only 0\.0 GiB is available \(HFSPEC_AVAILABLE_MEMORY\)"):
        load_model(folder, role="target", progress=False)


def test_the_memory_estimate_prices_the_load_dtype(saved_folder, monkeypatch):
    folder, params = saved_folder
    assert memory.checkpoint_dtype(folder) == torch.bfloat16
    assert memory.weight_bytes_on_load(folder, "auto") == 2 * params
    assert memory.weight_bytes_on_load(folder, torch.float32) == 4 * params
    need = memory.check_fits(folder, torch.float32, available=1 << 40)
    assert need > 4 * params
    with pytest.raises(HfspecError, match="allowed: a smaller model, dtype bfloat16"):
        memory.check_fits(folder, torch.float32, role="target", available=need - 1)
    # enough memory: the default ("auto") load runs and keeps the saved dtype
    monkeypatch.setenv(memory.ENV, "64GiB")
    assert load_model(folder, progress=False).dtype == torch.bfloat16


def test_a_bad_memory_override_names_the_variable(monkeypatch):
    monkeypatch.setenv(memory.ENV, "lots")
    with pytest.raises(HfspecError, match="HFSPEC_AVAILABLE_MEMORY: got 'lots'; allowed"):
        memory.available_bytes()
    assert memory.parse_size("2GiB") == 2 << 30 and memory.parse_size("500MB") == 500 * 10**6


# ------------------------------------------------------------------------------------------------ verify advice
def test_advice_recommends_bf16_only_when_the_verify_pass_is_the_bottleneck():
    from hfspec import report
    from hfspec.decoding.stats import SpecStats
    from hfspec.measure import verify_cost
    from hfspec.session import Baseline

    baseline = Baseline(new_tokens=100, time_total=10.0)  # plain: 100 ms a token
    slow = SpecStats(target_passes=40, time_target=40 * 0.25)  # 250 ms a pass: 2.5x
    fast = SpecStats(target_passes=40, time_target=40 * 0.11)  # 1.1x
    assert verify_cost.verify_ratio(slow, baseline) == pytest.approx(2.5)
    line = verify_cost.advice(slow, baseline)
    assert "verify pass 2.5× a one-token step" in line and "--dtype bfloat16" in line
    assert any(row.startswith("advice") and "2.5×" in row for row in report.stats_lines(slow, baseline, 1.0))
    # negative controls: a cheap verify pass, a bf16 target, no baseline
    assert verify_cost.advice(fast, baseline) is None
    assert not any(row.startswith("advice") for row in report.stats_lines(fast, baseline, 1.0))
    assert verify_cost.advice(slow, baseline, torch.bfloat16) is None
    assert verify_cost.advice(slow, None) is None


def test_on_an_avx2_cpu_the_advice_says_float32_not_bf16(monkeypatch):
    from hfspec.decoding.stats import SpecStats
    from hfspec.measure import verify_cost
    from hfspec.session import Baseline

    baseline = Baseline(new_tokens=100, time_total=10.0)
    slow = SpecStats(target_passes=40, time_target=40 * 0.277)  # a bf16 pass over 5 positions on AVX2: 2.77x
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx2")
    line = verify_cost.advice(slow, baseline, torch.bfloat16)
    assert "no bfloat16 matmul instructions" in line and "float32" in line
    fp32 = verify_cost.advice(slow, baseline)
    assert "--dtype bfloat16" not in fp32 and "keep float32" in fp32
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")  # the control: bf16 is the remedy there
    assert verify_cost.advice(slow, baseline, torch.bfloat16) is None and "--dtype bfloat16" in verify_cost.advice(
        slow, baseline)


def test_on_an_amx_cpu_the_advice_says_bf16_without_prepack(monkeypatch):
    """On an Intel AMX CPU a bf16 verify pass is flat but prepacking fp32 gains little (oneDNN's one-row product is
    slower than sgemv there): the advice names bfloat16 alone, in the CLI's and the dashboard's words."""
    from hfspec.decoding.stats import SpecStats
    from hfspec.measure import verify_cost
    from hfspec.session import Baseline

    baseline = Baseline(new_tokens=100, time_total=10.0)
    slow = SpecStats(target_passes=40, time_target=40 * 0.16)  # an fp32 pass over 6 positions on AMX: 1.6x
    monkeypatch.setenv("HFSPEC_CPU_KIND", "amx")
    line = verify_cost.advice(slow, baseline)
    assert "--dtype bfloat16" in line and "prepack" not in line and "compare tokens/s" in line
    gui = verify_cost.advice(slow, baseline, switch="choosing bfloat16 in the Precision box (or ticking prepack)")
    assert "Precision box" in gui and "prepack" not in gui
    assert verify_cost.advice(slow, baseline, torch.bfloat16) is None
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")  # the control: prepacking is offered there
    assert "--prepack" in verify_cost.advice(slow, baseline)


# ------------------------------------------------------------------------------------------------ fast fp32 linear
@pytest.mark.skipif(not fast_linear.available(), reason="no oneDNN in this torch")
def test_prepacked_linear_computes_f_linear_and_keeps_greedy_identity():
    for arch in ("llama", "qwen2", "gpt_neox", "opt"):
        target = build(arch, init=0.2)
        draft = perturbed(target, scale=0.5)
        ids = torch.tensor([[0, 5, 17, 33, 9]])
        expected = target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60)
        with torch.no_grad():
            ref = target(ids).logits
        added = fast_linear.prepack(target)
        assert added == fast_linear.prepacked_bytes(target) > 0
        with torch.no_grad():
            got = target(ids).logits
        assert (got - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))  # fp32 rounding only
        out = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=0, max_new_tokens=60, min_new_tokens=60)
        assert torch.equal(out.sequences, expected), arch
        # plain decoding of the prepacked model runs it too (one-row calls are packed): the same text
        assert torch.equal(target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60), expected)
        assert 0 < out.stats.accepted < out.stats.checked
        # a weight changed in place is packed again (never a stale copy); negative control: it changes the logits
        layer = next(m for m in target.modules() if get_attr(m, PACKED) is not None)
        with torch.no_grad():
            layer.weight.mul_(1.5)
            changed = target(ids).logits
            fast_linear.unprepack(target)
            assert torch.allclose(changed, target(ids).logits, atol=1e-5)
            assert not torch.allclose(changed, ref, atol=1e-3)
        assert fast_linear.prepacked_bytes(target) == 0


def test_prepacking_leaves_half_precision_and_copies_alone():
    import copy

    assert fast_linear.prepack(_wide_llama(torch.bfloat16)) == 0
    target = _wide_llama(torch.float32)
    if fast_linear.prepack(target):
        assert fast_linear.prepacked_bytes(copy.deepcopy(target)) == 0  # a copy runs F.linear (its weights may change)


def test_a_draft_too_big_for_memory_is_refused_before_building(monkeypatch):
    target = _wide_llama(torch.bfloat16)
    need = memory.check_draft_fits(target, 4, 32, available=1 << 40)
    params = 4096 * 256 + 2 * (256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512)  # tied table once
    assert need == int(params * (0.5 + 4 / 32)) + memory.DRAFT_SCRATCH_BYTES
    monkeypatch.setenv(memory.ENV, str(need - 1))
    with pytest.raises(HfspecError, match=r"draft: an rtn4 draft of this target needs about .* allowed: a 2-4-bit"):
        make_draft(target, "rtn4")
    monkeypatch.setenv(memory.ENV, str(need))  # control: just enough memory builds it
    assert isinstance(make_draft(target, "rtn4"), LeanDecoder)


def test_verify_ratio_reads_the_cost_record_without_the_prefill():
    from hfspec.decoding.costmodel import CostRecord
    from hfspec.decoding.stats import SpecStats
    from hfspec.measure import verify_cost
    from hfspec.session import Baseline

    # one-position rounds at 100 ms and width-5 passes at 250 ms: 2.5x, whatever the prefill or the mean pass says
    record = CostRecord(width_rounds=[0, 10, 0, 0, 0, 20], width_seconds=[0.0, 1.0, 0.0, 0.0, 0.0, 5.0],
                        prefill_rounds=1, prefill_target_seconds=3.0)
    stats = SpecStats(target_passes=31, time_target=9.0, costs=record)
    assert verify_cost.verify_ratio(stats, Baseline(new_tokens=100, time_total=10.0)) == pytest.approx(2.5)
    # negative control: without any one-token timing the record says nothing and the mean-pass rule is used
    no_step = CostRecord(width_rounds=[0, 0, 0, 0, 0, 20], width_seconds=[0.0, 0.0, 0.0, 0.0, 0.0, 5.0])
    stats = SpecStats(target_passes=20, time_target=5.0, costs=no_step)
    assert verify_cost.verify_ratio(stats, Baseline(new_tokens=100, time_total=10.0)) == pytest.approx(2.5)
    assert verify_cost.verify_ratio(stats, None) is None


@pytest.mark.skipif(not fast_linear.available(), reason="no oneDNN in this torch")
def test_a_seeded_run_prices_a_prepacked_target_by_its_own_curve():
    """A prepacked fp32 target's verify pass costs about one of its steps (`VERIFY_CURVE_PRIOR` "float32+prepack"):
    a seeded run looks its priors up under that key (5 positions at 1.08 of a step, where the unpacked curve says
    1.32: the control) and prices its draft's step against the faster target step."""
    from hfspec.api import _Prices
    from hfspec.decoding.priors import prior_model
    from hfspec.decoding.stats import SpecStats

    target = build("llama", init=0.2)
    stats = SpecStats(target_bytes=4000, draft_bytes=624, target_dtype="float32")
    assert _Prices.of(target, None, stats, "cpu").dtype == "float32"
    fast_linear.prepack(target)
    try:
        prices = _Prices.of(target, None, stats, "cpu")
        assert prices.dtype == "float32+prepack"
        assert prices.c(stats) > _Prices(dtype="float32").c(stats)  # a faster target step: the draft costs more of it
        assert prior_model(prices.c(stats), "cpu", prices.dtype).verify(5) == pytest.approx(1.08)
        assert prior_model(prices.c(stats), "cpu", "float32").verify(5) == pytest.approx(1.32)
    finally:
        fast_linear.unprepack(target)
