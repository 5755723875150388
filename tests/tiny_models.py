"""Tiny randomly initialised causal LMs built from configs (no downloads), and drafts that disagree."""

from __future__ import annotations

import copy

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.generation.streamers import BaseStreamer

VOCAB = 96


def build(arch: str, vocab: int = VOCAB, layers: int = 2, seed: int = 0, init: float = 0.02, hidden: int = 32):
    """A tiny model of architecture `arch` in eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if arch == "llama":
        config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                             initializer_range=init, **common)
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                             initializer_range=init, **common)
        model = Qwen2ForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=1024, initializer_range=init,
                            **common)
        model = GPT2LMHeadModel(config)
    elif arch == "gpt_neox":
        config = GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=4, max_position_embeddings=1024, initializer_range=init,
                               **common)
        model = GPTNeoXForCausalLM(config)
    elif arch == "opt":
        config = OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                           max_position_embeddings=1024, word_embed_proj_dim=hidden, init_std=init, **common)
        model = OPTForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.eval()


def perturbed(model, scale: float, seed: int = 1):
    """A copy of `model` with Gaussian noise (relative to each tensor's std) on every weight: a draft that
    agrees with the target often but not always."""
    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for param in draft.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn_like(param) * param.std() * scale)
    return draft.eval()


# One tiny config per supported family (fidelity tests). Each entry: (config class, model class, size kwargs).
_LLAMA_LIKE = dict(intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA_LIKE),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_LLAMA_LIKE, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_LLAMA_LIKE, tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _LLAMA_LIKE),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _LLAMA_LIKE),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA_LIKE, sliding_window=8, query_pre_attn_scalar=8)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(_LLAMA_LIKE, sliding_window=8, query_pre_attn_scalar=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_head=4)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(intermediate_size=64, num_attention_heads=4)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_head=4)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=64, num_attention_heads=4, word_embed_proj_dim=32)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(num_attention_heads=4)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(intermediate_size=64, num_attention_heads=4,
                                                               num_key_value_heads=2)),
}


def build_family(family: str, seed: int = 0, init: float = 0.02, vocab: int = VOCAB, layers: int = 2):
    """A tiny random model of `family` (a key of FAMILIES), hidden size 32, in eval mode. `init` is the
    initializer range (std of the weights); larger values give peakier next-token distributions."""
    import transformers

    config_name, model_name, sizes = FAMILIES[family]
    config_cls = getattr(transformers, config_name)
    layer_key = "n_layer" if family in ("gpt2", "bloom") else "num_hidden_layers"
    hidden_key = "n_embd" if family == "gpt2" else "hidden_size"
    init_key = "init_std" if family == "opt" else "initializer_range"
    config = config_cls(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                        **{layer_key: layers, hidden_key: 32, init_key: init}, **sizes)
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).eval()


def sharpen(model, factor: float):
    """Multiply the final norm's output (weight and bias) by `factor`, so every logit is `factor` times larger:
    peaky next-token distributions without touching the (possibly tied) embeddings. Returns `model`."""
    base = model.base_model
    norm = next(getattr(base, n) for n in ("norm", "ln_f", "final_layer_norm", "decoder") if hasattr(base, n))
    norm = getattr(norm, "final_layer_norm", norm)  # OPT keeps it in its decoder
    with torch.no_grad():
        if "Gemma" in type(norm).__name__:  # Gemma's RMSNorm multiplies by (1 + weight)
            norm.weight.copy_((1 + norm.weight) * factor - 1)
        else:
            norm.weight.mul_(factor)
            if getattr(norm, "bias", None) is not None:
                norm.bias.mul_(factor)
    return model


class Collect(BaseStreamer):
    """A streamer that keeps what it is given: `chunks` (token lists, the prompt first) and whether it ended."""

    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True
