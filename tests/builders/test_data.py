"""The real Mistral v3 tokenizer, the chat format and the label mask of the default data."""

import json
import random

import pytest
import torch
from conftest import SAME_MATH, compose_cfg
from omegaconf import OmegaConf

from lorabench.builders import data
from lorabench.builders.modeling import build_tokenizer


def tokenize_chat(tokenizer, prompt, answer, seq_len):
    """One user/assistant exchange as the data pipeline renders it (loss on the answer only)."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    out = data.tokenize_record(tokenizer, {"messages": messages}, seq_len, assistant_only=True)
    out.pop("n_tokens")
    return out


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
    sample = tokenize_chat(tok, "What is 7 plus 5?", "7 plus 5 is 12.", seq_len=1024)
    ids, labels = sample["input_ids"], sample["labels"]
    assert tok.convert_ids_to_tokens(ids[:2]) == ["<s>", "[INST]"] and ids[-1] == 2  # ... </s>
    inst_end = ids.index(4)  # [/INST]
    assert all(x == data.IGNORE for x in labels[: inst_end + 1])
    assert labels[inst_end + 1:] == ids[inst_end + 1:]
    assert tok.decode([t for t in labels if t != data.IGNORE], skip_special_tokens=True).strip() == "7 plus 5 is 12."


def test_truncation_to_seq_len(tok):
    sample = tokenize_chat(tok, "What is 7 plus 5?", "7 plus 5 is 12.", seq_len=8)
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
    batch = data.build_collator(c, tok)([tokenize_chat(tok, "What is 1 plus 1?", "1 plus 1 is 2.", 64),
                                          tokenize_chat(tok, "What is 10 times 12?", "10 times 12 is 120.", 64)])
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == (width or int(lengths.max()))
    assert lengths[0] < lengths[1]
    pad = batch["attention_mask"] == 0
    assert pad.any() and torch.all(batch["labels"][pad] == data.IGNORE)


# ---------------------------------------------------------------------------- real data (issue: data axis)

def write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def cell(tmp_path, **over):
    """A typed config for data tests, its cache in tmp_path."""
    args = [f"data.cache_dir={tmp_path / 'cache'}"] + [f"{k}={v}" for k, v in over.items()]
    return OmegaConf.to_object(compose_cfg(args))


CONV = [{"role": "user", "content": "Hi, who are you?"}, {"role": "assistant", "content": "A model."},
        {"role": "user", "content": "And what do you do?"}, {"role": "assistant", "content": "I answer."}]


def test_multi_turn_labels_keep_only_assistant_turns(tok):
    t = data.tokenize_record(tok, {"messages": CONV}, seq_len=512, assistant_only=True)
    ids, labels = t["input_ids"], t["labels"]
    kept = [i for i, x in enumerate(labels) if x != data.IGNORE]
    # exactly the tokens after each [/INST] up to and including its </s>
    spans = tok.decode([ids[i] for i in kept], skip_special_tokens=False).replace("▁", " ")
    assert spans.count("</s>") == 2 and "A model." in spans and "I answer." in spans
    assert "Hi, who" not in spans and "what do you do" not in spans and "[INST]" not in spans
    everything = data.tokenize_record(tok, {"messages": CONV}, seq_len=512, assistant_only=False)
    assert everything["labels"] == ids


def test_plain_text_trains_on_every_token(tok):
    t = data.tokenize_record(tok, {"text": "Just some text."}, seq_len=512, assistant_only=True)
    assert t["input_ids"][0] == data.BOS and t["input_ids"][-1] == data.EOS and t["labels"] == t["input_ids"]


@pytest.mark.parametrize("record,expected", [
    ({"messages": CONV}, {"messages": CONV}),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
     {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    ({"instruction": "Add", "input": "2 and 3", "output": "5"},
     {"messages": [{"role": "user", "content": "Add\n\n2 and 3"}, {"role": "assistant", "content": "5"}]}),
    ({"instruction": "Say hi", "output": "hi"},
     {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}),
    ({"text": "plain"}, {"text": "plain"}),
])
def test_record_shapes(record, expected):
    assert data.normalize(record, "x") == expected


@pytest.mark.parametrize("lines,message", [
    (['{"text": "ok"}', '{"text": "ok"', '{"text": "ok"}'], "train.jsonl:2: not valid JSON"),
    (['{"text": "ok"}', '{"prompt": "a", "completion": "b"}'], "train.jsonl:2: record has none of the fields"),
    (['{"messages": [{"role": "user", "content": "q"}]}'], "train.jsonl:1: conversation has no assistant turn"),
    (['{"messages": [{"role": "wizard", "content": "q"}, {"role": "assistant", "content": "a"}]}'],
     "train.jsonl:1: role 'wizard' in turn 0 is not one the Mistral v3 template knows"),
    (['{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}'], "turn 0 needs 'role' and 'content'"),
    (['[1, 2]'], "train.jsonl:1: expected a JSON object"),
    (['{"text": "ok"}', '{"text": "  "}'], "train.jsonl:2: 'text' is empty, so nothing to train on"),
    (['', '  '], "no records (the file is empty)"),
    (['{"text": "ok"}', '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, '
      '{"role": "user", "content": "and then?"}]}'], "train.jsonl:2: the Mistral v3 chat template refused"),
])
def test_bad_jsonl_is_rejected_with_file_and_line(tmp_path, tok, lines, message):
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    with pytest.raises(data.DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        data.build_dataset(cell(tmp_path, data="jsonl", **{"data.path": path}), tok)
    assert not list((tmp_path / "cache").glob("*.arrow"))  # nothing half-written is left to be reused


def test_missing_file_is_named(tmp_path, tok):
    with pytest.raises(data.DataError, match="no such file"):
        data.build_dataset(cell(tmp_path, data="jsonl", **{"data.path": tmp_path / "nope.jsonl"}), tok)


def test_tokenisation_is_cached_per_data_tokenizer_and_seq_len(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", [json.dumps({"messages": CONV})] * 5)
    c = cell(tmp_path, data="jsonl", **{"data.path": path})
    first, s1 = data.build_dataset(c, tok)
    second, s2 = data.build_dataset(c, tok)
    assert (s1["data/cache_hit"], s2["data/cache_hit"]) == (False, True)
    assert first.to_list() == second.to_list()
    assert not data.build_dataset(cell(tmp_path, data="jsonl", seq_len=16, **{"data.path": path}), tok)[1]["data/cache_hit"]
    write_jsonl(path, [json.dumps({"messages": CONV})] * 6)  # the file changed
    again, s3 = data.build_dataset(c, tok)
    assert not s3["data/cache_hit"] and len(again) == 6


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_overlong_samples_are_truncated_or_dropped_and_counted(tmp_path, tok, overlong):
    lines = [json.dumps({"text": "word " * n}) for n in (3, 50, 4, 80)]
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    ds, stats = data.build_dataset(cell(tmp_path, data="jsonl", seq_len=32, **{"data.path": path,
                                                                               "data.overlong": overlong}), tok)
    assert stats["data/overlong"] == 2
    if overlong == "truncate":
        assert stats["data/truncated"] == 2 and len(ds) == 4 and max(len(r) for r in ds["input_ids"]) == 32
    else:
        assert stats["data/dropped"] == 2 and len(ds) == 2 and max(len(r) for r in ds["input_ids"]) < 32


def test_dropping_every_sample_is_an_error(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", [json.dumps({"text": "word " * 50})])
    with pytest.raises(data.DataError, match="dropped them all"):
        data.build_dataset(cell(tmp_path, data="jsonl", seq_len=8, **{"data.path": path, "data.overlong": "drop"}), tok)


def test_a_sample_left_with_no_label_to_train_is_dropped_and_counted(tmp_path, tok):
    """A user turn longer than seq_len leaves its conversation no assistant token: at batch 1 its row's mean
    loss would be 0 / 0 (NaN, as a packed ShareGPT search at b1 met on the GPU)."""
    long_question = [{"role": "user", "content": "why " * 60}, {"role": "assistant", "content": "because"}]
    path = write_jsonl(tmp_path / "train.jsonl", [json.dumps({"messages": m}) for m in (CONV, long_question, CONV)])
    ds, stats = data.build_dataset(cell(tmp_path, data="jsonl", seq_len=32, **{"data.path": path}), tok)
    assert stats["data/no_labels_dropped"] == 1 and len(ds) == 2
    assert all(any(t != data.IGNORE for t in labels[1:]) for labels in ds["labels"])
    only_long = write_jsonl(tmp_path / "long.jsonl", [json.dumps({"messages": long_question})])
    with pytest.raises(data.DataError, match="no sample has a token to train on within seq_len=32"):
        data.build_dataset(cell(tmp_path, data="jsonl", seq_len=32, **{"data.path": only_long}), tok)


def test_sharegpt_ships_real_conversations(tmp_path, tok):
    ds, stats = data.build_dataset(cell(tmp_path, data="sharegpt", seq_len=256, **{"data.max_samples": 12}), tok)
    # Conversations whose first user turn fills the 256 tokens have nothing to train on: dropped, counted.
    assert len(ds) + stats["data/no_labels_dropped"] == 12 and len(ds) >= 8 and stats["data/source_records"] > 17000
    assert 0 < stats["data/skipped_invalid"] < stats["data/source_records"] / 10
    row = ds[0]
    assert row["input_ids"][:2] == [data.BOS, 3] and any(x != data.IGNORE for x in row["labels"])
    again, _ = data.build_dataset(cell(tmp_path / "b", data="sharegpt", seq_len=256, **{"data.max_samples": 12}), tok)
    other, _ = data.build_dataset(cell(tmp_path / "c", data="sharegpt", seq_len=256,
                                       **{"data.max_samples": 12, "data.seed": 1}), tok)
    assert again["input_ids"] == ds["input_ids"] != other["input_ids"]  # the subset is seeded


def test_hf_save_to_disk_directory(tmp_path, tok):
    import datasets

    datasets.Dataset.from_list([{"instruction": "Say hi", "output": "hi"}] * 3).save_to_disk(str(tmp_path / "ds"))
    ds, _ = data.build_dataset(cell(tmp_path, data="hf", **{"data.path": tmp_path / "ds"}), tok)
    assert len(ds) == 3
    with pytest.raises(data.DataError, match="datasets are offline"):
        data.build_dataset(cell(tmp_path, data="hf", **{"data.path": "someone/some-dataset"}), tok)


# ---------------------------------------------------------------------------- packing

def test_pack_keeps_every_sample_once_within_seq_len():
    rng = random.Random(0)
    samples = [{"input_ids": [1] + [rng.randint(1000, 2000) for _ in range(n - 1)],
                "labels": [data.IGNORE] + [7] * (n - 1)} for n in (rng.randint(2, 40) for _ in range(200))]
    rows = data.pack(samples, seq_len=64)
    assert all(len(r["input_ids"]) <= 64 for r in rows)
    assert sum(len(r["input_ids"]) for r in rows) == sum(len(s["input_ids"]) for s in samples)
    assert sum(r["position_ids"].count(0) for r in rows) == len(samples)
    assert len(rows) < len(samples) / 2  # short samples share rows
    for r in rows:  # each sample's first label is masked: it would be predicted across the boundary
        assert all(lab == data.IGNORE for lab, p in zip(r["labels"], r["position_ids"]) if p == 0)


def test_packed_sample_equals_the_sample_alone(tmp_path, tok):
    """A sample packed between others gets the same logits and loss as alone: attention stays inside
    each sample (transformers' block-diagonal mask from position_ids, SDPA). float64: the same
    arithmetic, reduced over differently shaped masked rows, within SAME_MATH of the logits' size."""
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    c = cell(tmp_path)
    torch.manual_seed(0)
    # float64: packed or alone, the model computes the same sums, only their order can differ
    model = AutoModelForCausalLM.from_config(hf_config(c.model), attn_implementation="sdpa").double().eval()
    a, b, d = (data.tokenize_record(tok, {"messages": m}, 64, True) for m in (
        CONV, [CONV[0], CONV[1]], [{"role": "user", "content": "x " * 20}, {"role": "assistant", "content": "y"}]))
    for s in (a, b, d):
        s.pop("n_tokens")
    rows = data.pack([b, a, d], seq_len=256)
    assert len(rows) == 1
    batch = data.PackedCollator(tok.pad_token_id, width=256)(rows)
    real = batch.pop(data.REAL_TOKENS)
    assert int(real.sum()) == sum(len(s["input_ids"]) for s in (a, b, d)) < 256  # a padding tail too
    # where is `a` in the row? (packing orders samples longest first)
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    start = next(s for s in starts if batch["input_ids"][0, s:s + len(a["input_ids"])].tolist() == a["input_ids"])
    span = slice(start, start + len(a["input_ids"]))
    with torch.no_grad():
        packed = model(**batch).logits[0, span]
        alone = model(input_ids=torch.tensor([a["input_ids"]])).logits[0]
        ce = torch.nn.functional.cross_entropy
        lab = torch.tensor(a["labels"])
        loss_alone = ce(alone[:-1], lab[1:], ignore_index=data.IGNORE)
        loss_packed = ce(packed[:-1], batch["labels"][0, span][1:], ignore_index=data.IGNORE)
    # transformers' fp32 roundings (SAME_MATH, conftest) relative to the logits' and the loss's size
    bound = SAME_MATH * alone.abs().max().item()
    assert torch.allclose(packed, alone, atol=bound, rtol=0), (packed - alone).abs().max()
    assert abs(loss_packed.item() - loss_alone.item()) <= SAME_MATH * loss_alone.item()
    # and without the position_ids the samples would see each other: the check above can fail
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"]).logits[0, span]
    assert (leaky - alone).abs().max() > 1e4 * bound


def test_meter_counts_the_same_tokens_packed_or_not(tok):
    """Non-pad tokens, label tokens, samples and the attention sum of l^2 do not depend on packing."""
    from lorabench.measure.meter import StepMeter

    samples = [data.tokenize_record(tok, {"messages": m}, 64, True) for m in ([CONV[0], CONV[1]], CONV)]
    for s in samples:
        s.pop("n_tokens")
    c = OmegaConf.to_object(compose_cfg(["seq_len=64"]))
    counts = []
    for batch in (data.build_collator(c, tok)(samples), data.PackedCollator(tok.pad_token_id, 64)(data.pack(samples, 64))):
        meter = StepMeter.__new__(StepMeter)
        meter._counts, meter._positions = torch.zeros(4, dtype=torch.int64), 0
        real = batch.pop(data.REAL_TOKENS, None)
        meter.count_batch(batch, batch["attention_mask"] if real is None else real)
        counts.append(meter._counts.tolist())
    lengths = [len(s["input_ids"]) for s in samples]
    labelled = sum(sum(x != data.IGNORE for x in s["labels"]) for s in samples)
    assert counts[0] == counts[1] == [sum(lengths), sum(n * n for n in lengths), labelled, 2]


def test_rows_of_131072_tokens_synthetic_and_from_long_documents(tmp_path, tok):
    """seq_len=131072: a synthetic row is 131,072 ids below the vocabulary, stacked as they are; the user's long
    documents ({"text": ...} lines of data=jsonl) are cut at seq_len (a 140,000-token book gives one full row,
    counted in data/truncated) or, packed, fill rows of at most seq_len tokens."""
    n = 131_072
    rows = data.SyntheticTokens(num_samples=2, seq_len=n, vocab_size=128_256, seed=0)
    batch = data.synthetic_collator([rows[0], rows[1]])
    assert batch["input_ids"].shape == (2, n) and int(batch["input_ids"].max()) < 128_256
    assert bool(batch["attention_mask"].all())
    book, note = "The whale swam on. " * 20_000, "A short note. " * 2_000
    path = write_jsonl(tmp_path / "books.jsonl", [json.dumps({"text": book}), json.dumps({"text": note})])
    ds, stats = data.build_dataset(cell(tmp_path, data="jsonl", seq_len=n, **{"data.path": path,
                                                                                "model.max_position_embeddings": n}), tok)
    assert stats["data/truncated"] == 1 and max(len(r) for r in ds["input_ids"]) == n
    packed, stats = data.build_dataset(cell(tmp_path, data="jsonl", seq_len=n, **{"data.path": path,
                                                                                    "data.packing": "true"}), tok)
    assert stats["data/packed_rows"] == 2 and max(len(r["input_ids"]) for r in packed) == n
