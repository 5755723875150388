"""The int8 draft kind: per-channel int8 codes run by the CPU int8 kernel on the lean step. Its linears compute
x W^T within the grid's and bf16's rounding (a wrong scale fails), its step stays close to the float step, greedy
decoding through it is exact, and its spec strings read (and fail) by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_models import build_family, sharpen
from transformers import AutoModelForCausalLM

import hfspec
from hfspec.attrs import DRAFT_SPEC, get_attr
from hfspec.drafts import describe, make_draft, parse_draft_spec, registry
from hfspec.drafts.int8 import draft_bytes
from hfspec.errors import HfspecError
from hfspec.kernels.lean import LeanDecoder
from hfspec.kernels.lean_layers import LeanLinear
from hfspec.quant import int8

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"
pytestmark = pytest.mark.skipif(int8.kernel_reason() is not None, reason=str(int8.kernel_reason()))


def _target(family: str = "llama"):
    return sharpen(build_family(family, init=0.1), 6.0)


def _ids(n: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.minimum(a.softmax(-1), b.softmax(-1)).sum(-1).mean())


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("shape", [(96, 64), (40, 48), (200, 32)])
def test_linear_computes_x_w_within_the_grid_and_a_wrong_scale_fails(shape):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g) * torch.rand(shape[0], 1, generator=g)  # rows of different scales
    b = torch.randn(shape[0], generator=g)
    x = torch.randn(5, shape[1], generator=g)
    lin = LeanLinear([w[: shape[0] // 2], w[shape[0] // 2:]], b, 8, int8.PER_CHANNEL)  # a fused matrix, in 2 parts
    assert lin.int8 and lin.path == int8.PATH
    assert lin.codes.dtype == torch.int8 and lin.codes.shape == shape and lin.scales.shape == (shape[0],)
    assert int(lin.codes.abs().max()) == int8.CODE_MAX  # every row uses its whole range
    want = F.linear(x, w, b)
    got = lin(x)
    # int8 codes (step amax/127 per row) with bf16 activations, scales and output: about 1% of the largest output
    assert _relative_error(got, want) <= 0.015
    # the kernel's product is the dequantised grid's, to bf16 rounding
    exact = F.linear(x.bfloat16().float(), int8.dequantize(lin.codes, lin.scales), b)
    assert _relative_error(got, exact) <= 0.01
    # negative control: a scale 5% off on every row is caught by the same bound
    lin.scales.mul_(1.05)
    assert _relative_error(lin(x), want) > 0.015
    # embedding rows read through the same storage
    ids = torch.tensor([0, 3, shape[0] - 1])
    assert torch.allclose(lin.rows(ids, torch.float32), int8.dequantize(lin.codes[ids], lin.scales[ids]))


def test_a_k_the_kernel_cannot_take_keeps_the_grid_in_fp32():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(24, 40, generator=g), torch.randn(3, 40, generator=g)  # 40 % 16 != 0
    lin = LeanLinear(w, None, 8, int8.PER_CHANNEL)
    assert not lin.int8 and "dequantised to fp32" in lin.path and lin.weight.dtype == torch.float32
    assert _relative_error(lin(x), F.linear(x, w)) <= 0.015


def test_the_draft_step_is_int8_and_close_to_the_float_step():
    target = _target()
    draft = make_draft(target, "int8")
    assert isinstance(draft, LeanDecoder)
    assert all(lin.int8 for block in draft.blocks for lin in block.linears())
    assert int8.PATH in describe(draft)["step"]
    ids = _ids()
    want = LeanDecoder(target, bits=None)(ids).logits
    got = draft(ids).logits
    assert _relative_error(got, want) <= 0.05
    assert _overlap(got, want) >= 0.98
    # negative control: a random model of the same family is far from the target
    other = LeanDecoder(sharpen(build_family("llama", init=0.1, seed=7), 6.0), bits=None)(ids).logits
    assert _overlap(other, want) < _overlap(got, want) - 0.1


def test_incremental_steps_match_one_pass():
    draft = make_draft(_target(), "int8")
    ids = _ids(20)
    full = draft(ids).logits
    cache = draft.hfspec_new_cache()
    draft(ids[:, :12], cache=cache)
    steps = [draft(ids[:, i:i + 1], cache=cache).logits[:, -1] for i in range(12, 20)]
    assert torch.allclose(torch.stack(steps, 1), full[:, 12:20], atol=2e-2)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_greedy_output_equals_plain_with_the_int8_draft(family):
    target = _target(family)
    draft = make_draft(target, "int8")
    prompt = _ids(6, seed=3)
    spec = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=20)
    plain = hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=20)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.draft_forwards > 0


def test_a_bf16_target_decodes_exactly_with_the_int8_draft():
    target = _target().to(torch.bfloat16)
    draft = make_draft(target, "int8")
    assert all(lin.int8 for block in draft.blocks for lin in block.linears())
    prompt = _ids(6, seed=4)
    spec = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=16)
    plain = hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=16)
    assert torch.equal(spec.sequences, plain.sequences)


def test_micro_int8_is_close():
    target = AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32).eval()
    ids = torch.randint(3, 2000, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = target(ids).logits
    assert _overlap(make_draft(target, "int8")(ids).logits, p) >= 0.98


@pytest.mark.parametrize("text,label,params", [
    ("int8", "int8", {}),
    ("INT8-top0", "int8-top0", {"head_top": 0}),
    ("int8-compiled", "int8-compiled", {"step": "compiled"}),
    ("int8-top8-compiled", "int8-top8-compiled", {"head_top": 8, "step": "compiled"}),
])
def test_specs_read(text, label, params):
    spec = parse_draft_spec(text)
    assert spec.kind == "int8" and spec.bits == 8 and spec.label == label and dict(spec.params) == params
    assert parse_draft_spec(registry.spec_of("int8", registry.fields_of(text))).label == label


@pytest.mark.parametrize("text,needle", [
    ("int8-g32", "no group size -gN (write int8, or rtn8-gN"),
    ("int8-top99999", "-topK (head logits re-scored) must be 0..1024, got 99999"),
    ("int8-fast", "write int8, optionally -topK, optionally ending in -compiled"),
    ("int8x", "cannot read 'int8x'"),
])
def test_bad_specs_name_the_field_and_the_allowed_values(text, needle):
    with pytest.raises(HfspecError) as err:
        parse_draft_spec(text)
    message = str(err.value)
    assert message.startswith("draft: ") and needle in message
    assert "int8[-topK][-compiled]" in message  # the allowed specs listed


def test_form_step_must_be_known():
    with pytest.raises(HfspecError, match="step must be one of eager, compiled, got 'fast'"):
        registry.spec_of("int8", {"step": "fast"})


def test_refused_where_there_is_no_lean_step_or_with_lean_false():
    with pytest.raises(HfspecError, match=r"needs the lean step .*allowed: rtn8"):
        make_draft(build_family("gpt2"), "int8")
    with pytest.raises(HfspecError, match="lean=False: an int8 draft runs only on the lean step"):
        make_draft(_target(), "int8", lean=False)
    with pytest.raises(HfspecError, match="head_top"):
        make_draft(_target(), "int8", head_top=-1)


def test_bytes_are_a_byte_a_weight_plus_a_scale_a_row():
    target = _target()
    need = draft_bytes(target)
    mats = [p for p in {p.data_ptr(): p for p in target.parameters() if p.dim() >= 2}.values()]
    assert need == sum(p.numel() + 2 * p.shape[0] for p in mats)
    draft = make_draft(target, "int8")
    codes = sum(lin.codes.numel() for block in draft.blocks for lin in block.linears())
    scales = sum(lin.scales.numel() * 2 for block in draft.blocks for lin in block.linears())
    assert hfspec.drafts.weight_bytes(draft) >= codes + scales


@pytest.mark.slow
def test_compiled_int8_step_computes_the_eager_step(tmp_path, monkeypatch):
    from hfspec.kernels import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "COMPILE_DIR", tmp_path)  # inductor's artefacts never in the user's ~/.cache
    target = _target()
    fast, eager = make_draft(target, "int8-compiled"), make_draft(target, "int8")
    assert fast.compiled_step is not None and "one-token step compiled" in describe(fast)["step"]
    ids = _ids(16)
    steps = {}
    for name, draft in (("fast", fast), ("eager", eager)):
        cache = draft.hfspec_new_cache()
        draft.logits(ids[:, :8], None, None, cache, 1)
        steps[name] = torch.cat([draft.logits(ids[:, i:i + 1], None, None, cache, 1) for i in range(8, 16)], 1)
    assert _relative_error(steps["fast"], steps["eager"]) <= 2 ** -6
    prompt = _ids(6, seed=3)
    spec = hfspec.generate(target, prompt, draft=fast, gamma=4, temperature=0, max_new_tokens=16)
    assert torch.equal(spec.sequences, hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=16).sequences)


def test_mixed_spec_puts_the_chosen_layers_at_int8():
    target = _target()
    draft = make_draft(target, "rtn4+int8:L1")
    paths = [{lin.path for lin in block.linears()} for block in draft.blocks]
    assert paths[1] == {int8.PATH} and int8.PATH not in paths[0]
    assert get_attr(draft, DRAFT_SPEC) == "rtn4-g32+int8:L1"
    prompt = _ids(6, seed=3)
    spec = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=16)
    assert torch.equal(spec.sequences, hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=16).sequences)
    # every layer at int8 computes what the int8 draft computes (the head here is the target's own: small)
    ids = _ids()
    assert torch.equal(make_draft(target, "rtn4+int8:L0-L1")(ids).logits, make_draft(target, "int8")(ids).logits)


def test_mixed_head_at_int8():
    big = sharpen(build_family("llama", init=0.1, vocab=40000, layers=1), 6.0)  # a head of 1.28M weights
    assert make_draft(big, "rtn4+int8:head-top0").head.path == int8.PATH
    assert make_draft(big, "rtn4-top0").head.path != int8.PATH


@pytest.mark.parametrize("text,label", [
    ("rtn4+int8:head", "rtn4-g32+int8:head"),
    ("RTN3-g64+int8:l2,l0-l1,head-top0-compiled", "rtn3-g64+int8:head,L0-L2-top0-compiled"),
])
def test_mixed_specs_read(text, label):
    spec = parse_draft_spec(text)
    assert spec.kind == "mixed" and spec.label == label
    assert parse_draft_spec(registry.spec_of("mixed", registry.fields_of(text))).label == label


@pytest.mark.parametrize("text,needle", [
    ("rtn4+int8:L3-L1", "int8 layer range L3-L1 runs backwards"),
    ("rtn4+int8:attn", "UNITS a comma-separated list of head, Li and Li-Lj"),
    ("rtn9+int8:head", "bits must be 2..8, got 9"),
    ("rtn4-g4+int8:head", "group size must be 8..8192, got 4"),
])
def test_bad_mixed_specs_name_the_field(text, needle):
    with pytest.raises(HfspecError) as err:
        parse_draft_spec(text)
    assert needle in str(err.value) and "rtnB[-gN]+int8:UNITS" in str(err.value)


def test_mixed_refuses_a_layer_the_target_lacks():
    with pytest.raises(HfspecError, match=r"int8 unit L5 is not a layer of this target; allowed: head, L0..L1"):
        make_draft(_target(), "rtn4+int8:L5")
