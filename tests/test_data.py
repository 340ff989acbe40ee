"""The real Mistral v3 tokenizer, the chat format and the label mask of the default data."""

import pytest
import torch
from conftest import compose_cfg
from omegaconf import OmegaConf

from lorabench import data
from lorabench.modeling import build_tokenizer


@pytest.fixture(scope="module")
def cfg():
    return OmegaConf.to_object(compose_cfg())


@pytest.fixture(scope="module")
def tok(cfg):
    return build_tokenizer(cfg.model)


def test_tokenizer_is_the_real_mistral_v3(tok):
    # LlamaTokenizer(vocab_file=...) in transformers 5 silently gives a 3-token vocabulary.
    assert len(tok) == 32768
    text = "Fine-tune Mistral-7B: 2+2=4, naïve café ✓"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens([1, 2, 3, 4]) == ["<s>", "</s>", "[INST]", "[/INST]"]


def test_chat_format_and_answer_only_labels(tok):
    sample = data.tokenize_chat(tok, "What is 7 plus 5?", "7 plus 5 is 12.", seq_len=1024)
    ids, labels = sample["input_ids"], sample["labels"]
    assert tok.convert_ids_to_tokens(ids[:2]) == ["<s>", "[INST]"] and ids[-1] == 2  # ... </s>
    inst_end = ids.index(4)  # [/INST]
    assert all(x == data.IGNORE for x in labels[: inst_end + 1])
    assert labels[inst_end + 1:] == ids[inst_end + 1:]
    assert tok.decode([t for t in labels if t != data.IGNORE], skip_special_tokens=True).strip() == "7 plus 5 is 12."


def test_truncation_to_seq_len(tok):
    sample = data.tokenize_chat(tok, "What is 7 plus 5?", "7 plus 5 is 12.", seq_len=8)
    assert len(sample["input_ids"]) == len(sample["labels"]) == 8


def test_tiny_instruct_is_deterministic_and_correct():
    a, b = data.tiny_instruct_pairs(50, seed=3), data.tiny_instruct_pairs(50, seed=3)
    assert a == b and a != data.tiny_instruct_pairs(50, seed=4)
    for q, ans in a:
        x, op, y = q.removeprefix("What is ").removesuffix("?").split()
        expected = {"plus": int(x) + int(y), "minus": int(x) - int(y), "times": int(x) * int(y)}[op]
        assert ans == f"{x} {op} {y} is {expected}."


def test_synthetic_rows_are_fixed_length_and_reproducible():
    ds = data.SyntheticTokens(num_samples=4, seq_len=16, vocab_size=32768, seed=0)
    assert len(ds) == 4 and ds[2] == ds[2] and ds[1] != ds[2]
    row = ds[0]["input_ids"]
    assert len(row) == 16 and min(row) >= data.FIRST_PLAIN_TOKEN and max(row) < 32768


@pytest.mark.parametrize("padding,width", [("longest", None), ("max_length", 64)])
def test_collator_pads_right_and_masks_padding(cfg, tok, padding, width):
    c = OmegaConf.to_object(compose_cfg([f"data.padding={padding}", "seq_len=64"]))
    batch = data.build_collator(c, tok)([data.tokenize_chat(tok, "What is 1 plus 1?", "1 plus 1 is 2.", 64),
                                          data.tokenize_chat(tok, "What is 10 times 12?", "10 times 12 is 120.", 64)])
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == (width or int(lengths.max()))
    assert lengths[0] < lengths[1]
    pad = batch["attention_mask"] == 0
    assert pad.any() and torch.all(batch["labels"][pad] == data.IGNORE)
