"""`hfspec export-draft`: RTN drafts saved as compressed-tensors checkpoints, loaded back by transformers on the
CPU, compared with hfspec's RTN draft (with the target's own embedding and head, as exported), and used as drafts (hfspec.generate, generate(assistant_model=)).

How close the export can be: hfspec's RTN keeps a float zero per group, compressed-tensors an integer zero point,
so the export keeps hfspec's step and rounds each weight again on a grid through 0 (`hfspec.io.export_draft`). The
weight-level checks are exact bounds (within half a step, hfspec's own step); at the logit level the export and
hfspec's draft are two roundings on the same step, so each is as far from the target as the other: the tests
allow the export 1.3x the reference draft's mean distance, and an 8-bit export must come much closer than a
4-bit one (the comparison can tell quantisation levels apart).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hfspec
from hfspec.cli import main
from hfspec.errors import HfspecError
from hfspec.io.export_draft import EXPORT_BITS, check_exportable, export_draft, pack_to_int32, rtn_dense

pytest.importorskip("compressed_tensors")

MODELS = Path(__file__).resolve().parents[1] / "presets" / "models"
SMOLLM2 = Path.home() / ".cache" / "hfspec-models" / "smollm2-135m-instruct"
N = 20


@pytest.fixture(scope="module")
def micro():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MODELS / "micro", local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(MODELS / "micro", local_files_only=True)


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def _checkpoint(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def _check_weights(target, loaded, folder, bits, group):
    """Every packed weight within half a step of the target's float weight (the step read from the checkpoint);
    asymmetric: the step is hfspec's own scale; the embedding holds the target's own values exactly."""
    from hfspec.quant import groupwise

    stored = _checkpoint(folder)
    float_sd, loaded_sd = target.state_dict(), loaded.state_dict()
    packed = [k[: -len(".weight_packed")] for k in stored if k.endswith(".weight_packed")]
    assert packed
    for name in packed:
        w = float_sd[f"{name}.weight"].float()
        got = loaded_sd[f"{name}.weight"].float()
        scale = stored[f"{name}.weight_scale"].float()
        step = scale.repeat_interleave(group, dim=1)
        assert ((got - w).abs() <= 0.5 * step * (1 + 1e-5) + 1e-7).all(), name
        if bits == 4:
            hf_scale, _ = groupwise.group_qparams(w, bits, group)
            assert torch.equal(scale, hf_scale.float()), name  # fp32 model: hfspec's fp16 step kept exactly
    embed = target.get_input_embeddings().weight
    assert torch.equal(loaded.get_input_embeddings().weight.float(), embed.float())
    assert not torch.equal(embed.float(), rtn_dense(embed, bits, group))  # control: RTN values would differ
    return len(packed)


def _decodes(target, draft, ids):
    plain = target.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    ours = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=0, max_new_tokens=N, min_new_tokens=N)
    assisted = target.generate(ids, assistant_model=draft, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    assert torch.equal(ours.sequences, plain)
    assert torch.equal(assisted, plain)
    return ours.stats


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("spec, words", [
    ("rtn3", "4 or 8-bit"), ("rtn6-g64", "4 or 8-bit"), ("rtn4-g256", "group size 256"),
    ("bnb-nf4", "bitsandbytes"), ("lookup", "no weights"), (str(MODELS / "nano"), "already a checkpoint"),
    ("gptq4", "float zero points"),
])
def test_unexportable_specs_name_draft_and_allowed(spec, words):
    with pytest.raises(HfspecError, match="draft: ") as error:
        check_exportable(spec)
    assert words in str(error.value) and "allowed: rtn4/rtn8 with -g32/-g64/-g128" in str(error.value)


def test_exportable_specs():
    assert [(p.bits, p.group_size) for p in map(check_exportable, ("rtn4", "rtn8-g128", "rtn4-g64-compiled"))] == \
        [(4, 32), (8, 128), (4, 64)]


def test_cli_refuses_before_loading(tmp_path, capsys):
    # the target does not exist: the draft and OUT are checked first, so the error is about them
    assert main(["export-draft", "--target", str(tmp_path / "none"), "--draft", "rtn2", str(tmp_path / "o")]) == 2
    assert "draft: rtn2-g32 cannot be exported" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["export-draft", "--target", str(tmp_path / "none"), str(tmp_path / "full")]) == 2
    assert "OUT: " in capsys.readouterr().err
    assert main(["export-draft", "--target", str(tmp_path / "none"), "--gamma", "0", str(tmp_path / "o")]) == 2
    assert "gamma: got 0" in capsys.readouterr().err


def test_packing_matches_compressed_tensors():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32 as reference

    torch.manual_seed(0)
    for bits in EXPORT_BITS:
        values = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (24, 40), dtype=torch.int8)
        for dim in (0, 1):
            assert torch.equal(pack_to_int32(values, bits, dim), reference(values, bits, dim))


# ---------------------------------------------------------------------------------------------- round trips
def test_micro_roundtrip_rtn4(micro, tmp_path, capsys):
    target, tok = micro
    out = tmp_path / "micro-rtn4"
    assert main(["export-draft", "--target", str(MODELS / "micro"), "--draft", "rtn4", "--gamma", "5", str(out)]) == 0
    command = capsys.readouterr().out.strip()
    assert command.startswith("vllm serve ") and "--speculative-config" in command
    config = json.loads(command.split("--speculative-config ")[1].strip("'"))
    assert config == {"method": "draft_model", "model": str(out), "num_speculative_tokens": 5}
    saved = json.loads((out / "config.json").read_text())["quantization_config"]
    assert saved["quant_method"] == "compressed-tensors" and saved["format"] == "pack-quantized"
    weights = saved["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"], weights["strategy"]) == (4, 32, False, "group")
    assert (out / "tokenizer.json").is_file() and (out / "README.md").is_file()

    loaded = _load(out)
    assert _check_weights(target, loaded, out, 4, 32) == 28
    ids = torch.randint(3, 2048, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = target(ids).logits
        mem = hfspec.make_draft(target, "rtn4", lean=False, fused=False)(ids).logits
        got = loaded(ids).logits
    assert (got - ref).abs().mean() <= 1.3 * (mem - ref).abs().mean()
    # the target's own head and embedding bring it closer than the all-quantised HF-forward draft
    assert (got - ref).abs().mean() < (mem - ref).abs().mean()
    stats = _decodes(target, loaded, tok("Once upon a time", return_tensors="pt").input_ids)
    assert stats.alpha > 0.5


def test_micro_rtn8_is_closer_and_loads_as_sibling(micro, tmp_path):
    target, tok = micro
    result = export_draft(target, "rtn8", tmp_path / "micro-rtn8", tokenizer=tok)
    result4 = export_draft(target, "rtn4", tmp_path / "micro-rtn4")
    assert result.check["export_vs_target"] < 0.2 * result4.check["export_vs_target"]
    assert result.check["export_vs_target"] <= 1.3 * result.check["draft_vs_target"]
    assert result.max_error_steps <= 0.5 + 1e-4 and result.widened_groups == 0
    saved = json.loads((result.folder / "config.json").read_text())["quantization_config"]
    assert saved["config_groups"]["group_0"]["weights"]["symmetric"] is True
    # hfspec's own loader reads the folder as a sibling draft
    draft = hfspec.make_draft(target, str(result.folder))
    _decodes(target, draft, tok("The cat", return_tensors="pt").input_ids)


@pytest.mark.parametrize("family, cls", [("gemma3", "Gemma3ForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_tiny_family_roundtrip(tmp_path, family, cls):
    """Gemma 3 (scaled, tied embedding; sandwich norms) and Qwen2 (QKV biases, untied LM head)."""
    from tiny_models import build_family

    target = build_family(family, init=0.1)
    result = export_draft(target, "rtn4", tmp_path / family)
    loaded = _load(result.folder)
    assert type(loaded).__name__ == cls
    assert _check_weights(target, loaded, result.folder, 4, 32) == 14
    head = target.get_output_embeddings().weight
    assert torch.equal(loaded.get_output_embeddings().weight.float(), head.float())  # the target's own head
    assert result.check["export_vs_target"] <= 1.3 * result.check["draft_vs_target"]
    _decodes(target, loaded, torch.tensor([[0, 5, 17, 42, 9]]))


def test_bf16_target_and_widened_groups(tmp_path):
    from tiny_models import build

    target = build("llama", seed=3)
    with torch.no_grad():  # one group of all-positive weights: 0 lies outside hfspec's grid there
        target.model.layers[0].mlp.down_proj.weight[0, :32] = torch.linspace(0.5, 1.0, 32)
    target = target.to(torch.bfloat16)
    result = export_draft(target, "rtn4", tmp_path / "bf16", check=False)
    assert result.widened_groups == 1 and result.max_error_steps <= 0.5 + 1e-3
    stored = _checkpoint(result.folder)
    assert stored["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.bfloat16
    loaded = _load(result.folder)
    w = target.model.layers[0].mlp.down_proj.weight.float()
    got = loaded.model.layers[0].mlp.down_proj.weight.float()
    step = stored["model.layers.0.mlp.down_proj.weight_scale"].float().repeat_interleave(32, dim=1)
    # half a step, plus bf16's rounding of the dequantised value (2^-9 relative, the layer's own dtype)
    assert ((got - w).abs() <= 0.5 * step * 1.001 + w.abs() * 2**-8).all()


def test_refuses_conv1d_and_ragged_groups(tmp_path, micro):
    from tiny_models import build

    with pytest.raises(HfspecError, match="Conv1D"):
        export_draft(build("gpt2"), "rtn4", tmp_path / "gpt2")
    with pytest.raises(HfspecError, match="not a multiple of group size 64"):
        export_draft(micro[0], "rtn4-g64", tmp_path / "g64")
    assert not (tmp_path / "gpt2").exists() and not (tmp_path / "g64").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2 / "model.safetensors").is_file(), reason=f"{SMOLLM2} absent")
def test_smollm2_roundtrip(tmp_path):
    """SmolLM2 here is a dequantised Q4_1 GGUF (asymmetric, fp16 scale and minimum, blocks of 32): hfspec's
    rtn4 reproduces most of its weights exactly, an integer zero point cannot, so only the weight bounds and
    decoding are checked here, and the export is reported as far from the target as a fresh 4-bit rounding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    result = export_draft(target, "rtn4", tmp_path / "smollm2", tokenizer=tok, check=False)
    loaded = _load(result.folder)
    assert _check_weights(target, loaded, result.folder, 4, 32) == 210
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    stats = _decodes(target, loaded, ids)
    assert stats.alpha > 0.3
