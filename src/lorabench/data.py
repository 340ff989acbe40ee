"""Training data for a cell: generated chat samples (`tiny_instruct`) or random tokens (`synthetic`).

Every sample is a dict of `input_ids` and `labels` (-100 where no loss is taken). Batches are
right-padded by transformers' DataCollatorForSeq2Seq; `attention_mask` marks real tokens, and it is
what the throughput counts ("non-pad tokens").
"""

from __future__ import annotations

import random

import torch
from transformers import DataCollatorForSeq2Seq

from lorabench.config import Config, DataKind, Padding

IGNORE = -100  # label value the loss skips
FIRST_PLAIN_TOKEN = 1000  # Mistral v3 ids below this are control and byte tokens


def tiny_instruct_pairs(num_samples: int, seed: int) -> list[tuple[str, str]]:
    """Arithmetic questions with templated answers, e.g. ("What is 7 plus 5?", "7 plus 5 is 12.").

    Small enough for the tiny model to learn the answer template (and part of the arithmetic) in a
    few dozen CPU steps, so a falling loss is visible in the default run.
    """
    rng = random.Random(seed)
    ops = [("plus", lambda a, b: a + b), ("minus", lambda a, b: a - b), ("times", lambda a, b: a * b)]
    pairs = []
    for _ in range(num_samples):
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        word, fn = rng.choice(ops)
        pairs.append((f"What is {a} {word} {b}?", f"{a} {word} {b} is {fn(a, b)}."))
    return pairs


def tokenize_chat(tokenizer, prompt: str, answer: str, seq_len: int) -> dict:
    """Render one exchange with the Mistral v3 chat template; loss only on the answer.

    <s>[INST] prompt[/INST] answer</s>: everything up to and including [/INST] gets label -100.
    """
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
        tokenize=True, return_dict=False)
    inst_end = tokenizer.convert_tokens_to_ids("[/INST]")
    answer_start = len(ids) - ids[::-1].index(inst_end)
    labels = [IGNORE] * answer_start + ids[answer_start:]
    return {"input_ids": ids[:seq_len], "labels": labels[:seq_len]}


class SyntheticTokens(torch.utils.data.Dataset):
    """`num_samples` rows of exactly `seq_len` random ordinary token ids; every token is trained on.

    Each row is drawn from its own seeded generator, so row i is the same in every run and worker.
    """

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int):
        self.num_samples, self.seq_len, self.vocab_size, self.seed = num_samples, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        ids = torch.randint(FIRST_PLAIN_TOKEN, self.vocab_size, (self.seq_len,), generator=g).tolist()
        return {"input_ids": ids, "labels": list(ids)}


def build_dataset(cfg: Config, tokenizer):
    d = cfg.data
    if d.kind is DataKind.synthetic:
        return SyntheticTokens(d.num_samples, cfg.seq_len, cfg.model.vocab_size, d.seed)
    if d.kind is DataKind.tiny_instruct:
        return [tokenize_chat(tokenizer, q, a, cfg.seq_len) for q, a in tiny_instruct_pairs(d.num_samples, d.seed)]
    raise ValueError(f"data.kind={d.kind!r} is not handled")


def build_collator(cfg: Config, tokenizer) -> DataCollatorForSeq2Seq:
    max_length = cfg.seq_len if cfg.data.padding is Padding.max_length else None
    return DataCollatorForSeq2Seq(tokenizer, padding=cfg.data.padding.value, max_length=max_length,
                                  label_pad_token_id=IGNORE, return_tensors="pt")
