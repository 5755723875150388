"""Draft specs, sibling tokenizer checks, bitsandbytes drafts, cost measurement."""

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hfspec.drafts import (
    DraftSpec,
    check_same_tokenizer,
    make_draft,
    measure_cost,
    parse_draft_spec,
    registry,
)
from hfspec.errors import HfspecError

STORIES = str(Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K")  # ../shared


def tiny_llama(vocab=128, inter=172, layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def word_tokenizer(words):
    vocab = {w: i for i, w in enumerate(words)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token=words[0])))


@pytest.mark.parametrize("text,expected", [
    ("rtn4", DraftSpec("rtn", bits=4, group_size=32)),
    ("RTN3-g64", DraftSpec("rtn", bits=3, group_size=64)),
    ("rtn8-g128", DraftSpec("rtn", bits=8, group_size=128)),
    ("bnb-nf4", DraftSpec("bnb", bnb_type="nf4")),
    ("bnb-int8", DraftSpec("bnb", bnb_type="int8")),
    ("HuggingFaceTB/SmolLM2-135M", DraftSpec("sibling", source="HuggingFaceTB/SmolLM2-135M")),
])
def test_parse_good_specs(text, expected):
    assert parse_draft_spec(text) == expected


def test_parse_folder_and_model(tmp_path):
    assert parse_draft_spec(str(tmp_path)) == DraftSpec("sibling", source=str(tmp_path))
    model = tiny_llama()
    assert parse_draft_spec(model).kind == "model"


@pytest.mark.parametrize("text,needle", [
    ("rtn9", "bits must be 2..8, got 9"),
    ("rtn1", "bits must be 2..8, got 1"),
    ("rtn4-g3", "group size must be 8..8192, got 3"),
    ("rtn4-64", "cannot read 'rtn4-64'"),
    ("rtn", "cannot read"),
    ("bnb-nf3", "unknown bitsandbytes type"),
    ("int4", "unknown spec 'int4'"),
    ("./no/such/folder", "not found"),
    ("", "expected a spec"),
    (None, "expected a spec"),
])
def test_bad_specs_name_the_field(text, needle):
    with pytest.raises(HfspecError) as err:
        parse_draft_spec(text)
    message = str(err.value)
    assert message.startswith("draft: ") and needle in message
    assert f"allowed specs: {registry.allowed()}" in message
    assert "rtn2..rtn8[-gN][-topK][-compiled], gptq2..gptq8[-gN][-topK][-compiled], bnb-nf4, bnb-fp4, bnb-int8" in message and "or a model folder / hub id" in message


def test_exact_message_for_rtn9():
    with pytest.raises(HfspecError, match="^draft: bits must be 2..8, got 9; allowed specs: rtn2..rtn8"):
        make_draft(tiny_llama(), "rtn9")


def test_unknown_option_is_rejected():
    with pytest.raises(HfspecError, match="draft options: colour"):
        make_draft(tiny_llama(), "rtn4", colour="red")


def test_same_tokenizer_passes_and_different_fails():
    words = ["<unk>", "a", "b", "c", "d"]
    check_same_tokenizer(word_tokenizer(words), word_tokenizer(list(words)))
    with pytest.raises(HfspecError, match=r"draft: tokenizer differs from the target's at id 2"):
        check_same_tokenizer(word_tokenizer(words), word_tokenizer(["<unk>", "a", "x", "c", "d"]))
    with pytest.raises(HfspecError, match="draft: tokenizer has 4 tokens but the target's has 5"):
        check_same_tokenizer(word_tokenizer(words), word_tokenizer(words[:4]))


def test_model_object_sibling_checked():
    words = [f"w{i}" for i in range(100)]
    target, sibling = tiny_llama(vocab=128), tiny_llama(vocab=112, layers=1, seed=1)  # padded vocabularies
    tok = word_tokenizer(words)
    draft = make_draft(target, sibling, target_tokenizer=tok, draft_tokenizer=word_tokenizer(words))
    assert draft is sibling
    with pytest.raises(HfspecError, match="tokenizer differs"):
        make_draft(target, sibling, target_tokenizer=tok, draft_tokenizer=word_tokenizer(words[::-1]))
    with pytest.raises(HfspecError, match="vocab_size 112 differs"):
        make_draft(target, sibling)


def test_folder_sibling_loaded_and_checked(tmp_path):
    words = [f"w{i}" for i in range(128)]
    target = tiny_llama()
    sibling = tiny_llama(layers=1, seed=1)
    sibling.save_pretrained(tmp_path / "good")
    word_tokenizer(words).save_pretrained(tmp_path / "good")
    draft = make_draft(target, str(tmp_path / "good"), target_tokenizer=word_tokenizer(words))
    assert draft.config.num_hidden_layers == 1
    sibling.save_pretrained(tmp_path / "bad")
    word_tokenizer(words[::-1]).save_pretrained(tmp_path / "bad")
    with pytest.raises(HfspecError, match="tokenizer differs"):
        make_draft(target, str(tmp_path / "bad"), target_tokenizer=word_tokenizer(words))


@pytest.mark.shared
@pytest.mark.skipif(not os.path.isdir(STORIES), reason="needs ../shared/models/stories260K")
def test_stories_tokenizer_is_its_own_sibling():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(STORIES, local_files_only=True)
    check_same_tokenizer(tok, AutoTokenizer.from_pretrained(STORIES, local_files_only=True))
    with pytest.raises(HfspecError, match="tokenizer has 5 tokens but the target's has 512"):
        check_same_tokenizer(tok, word_tokenizer(["<unk>", "a", "b", "c", "d"]))


def test_measure_cost():
    target = tiny_llama(inter=128)
    report = measure_cost(target, make_draft(target, "rtn4", lean=False), prompt_len=8, repeats=3, warmup=1)
    assert report.target_ms > 0 and report.draft_ms > 0 and report.c_time > 0
    assert 0 < report.c_bytes < 0.5
