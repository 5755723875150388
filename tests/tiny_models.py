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
