"""Training backends (lorabench.run.backends): hf, liger, fast, unsloth.

The fast path must train the same model: its LoRA gradients on one batch are compared with hf's.
On CPU the Liger ops that Triton's interpreter can run (RoPE) take part; the GPU test runs them all.
"""

import importlib.util
import json

import pytest
import torch
from conftest import (
    BF16_GRADS,
    BF16_LOSS,
    FAST,
    SAME_MATH,
    assert_grads_close,
    compose_cfg,
    lora_grads,
    read_result,
    read_steps,
    requires_cuda,
    run_in_process,
)
from omegaconf import OmegaConf

from lorabench.builders import data, modeling
from lorabench.run import backends
from lorabench.run.loop import build_trainable_model

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None and importlib.util.find_spec("triton") is not None


@pytest.mark.parametrize("liger", [
    pytest.param([], id="cpu-parts"),
    # Liger's RoPE kernel through Triton's interpreter (its RMSNorm and SwiGLU kernels do not run there,
    # its fused cross-entropy does but takes minutes); needs the fast extra: pip install -e '.[fast]'
    pytest.param(["rope"], id="liger-rope",
                 marks=pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel not installed")),
])
def test_fast_path_gradients_match_hf_on_cpu(monkeypatch, float64, liger):
    """float64 on CPU: hf vs fast with half the layers checkpointed (and the Liger ops that run here).
    Same batch (no packing on either side): the loss and the gradients (relative to their norms)
    agree within SAME_MATH."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cpu = torch.device("cpu")
    loss_hf, g_hf, n_hf = lora_grads(["train.gradient_checkpointing=true"], cpu)
    loss_fast, g_fast, n_fast = lora_grads(["backend=fast", f"backend.liger=[{','.join(liger)}]", "data.packing=false",
                                            "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"],
                                           cpu)
    assert (n_hf, n_fast) == (2, 1)  # tiny model: 2 layers, all vs half checkpointed
    assert loss_fast == pytest.approx(loss_hf, rel=SAME_MATH)
    assert_grads_close(g_fast, g_hf, SAME_MATH)
    if liger:  # Liger's module-level RoPE was put back when the cell ended
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        from transformers.models.mistral import modeling_mistral

        assert modeling_mistral.apply_rotary_pos_emb is not liger_rotary_pos_emb


def test_checkpoint_fraction_selects_layers():
    c = OmegaConf.to_object(compose_cfg(["model.num_hidden_layers=4", "train.gradient_checkpointing=true",
                                         "train.checkpoint_fraction=0.5"]))
    model, _, (n, _) = build_trainable_model(c, torch.device("cpu"))
    assert n == 2 and [layer.gradient_checkpointing for layer in backends.decoder_layers(model)] == \
        [True, True, False, False]


def test_fast_backend_packs_real_data_not_synthetic():
    """backend=fast sets data.packing (one key for packing); synthetic rows are full already."""
    c = OmegaConf.to_object(compose_cfg(["backend=fast"]))
    assert data.packs(c) and c.data.packing
    assert not data.packs(OmegaConf.to_object(compose_cfg(["backend=fast", "data=synthetic"])))
    assert not data.packs(OmegaConf.to_object(compose_cfg(["backend=fast", "data.packing=false"])))
    assert not OmegaConf.to_object(compose_cfg(["backend=hf"])).data.packing
    # an experiment that sweeps the backend: each cell's packing follows its backend
    assert OmegaConf.to_object(compose_cfg(["+experiment=fast_vs_hf", "backend=fast"])).data.packing


def test_liger_on_cpu_is_refused_with_the_reason(tmp_path):
    result = run_in_process(["backend=liger", *FAST], tmp_path)
    assert result.status.value == "failed"
    assert "backend=liger" in result.error and "CUDA" in result.error and "backend=hf" in result.error


def test_unsloth_without_the_package_is_skipped(tmp_path):
    result = run_in_process(["backend=unsloth", *FAST], tmp_path)
    assert result.status.value == "skipped" and "pip install unsloth" in result.error


def test_unsloth_is_refused_on_cpu_and_with_options_it_does_not_read(monkeypatch):
    """As if Unsloth were installed: CPU is refused, and so are the other backends' options."""
    from lorabench.core.results import CellSkipped
    from lorabench.run.checks import check_values

    real = importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda n, *a: n == "unsloth" or real(n, *a))
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth"]))
    with pytest.raises(RuntimeError, match="backend=unsloth needs a CUDA GPU"):
        backends.check(c, torch.device("cpu"))
    backends.check(c, torch.device("cuda", 0))  # its own recipe passes (nothing runs on the GPU here)
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "backend.compile=true"]))
    with pytest.raises(ValueError, match="compile=True"):
        check_values(c)
    with pytest.raises(ValueError, match=r"backend=unsloth offloads its checkpointed layers' inputs itself"):
        check_values(OmegaConf.to_object(compose_cfg(["backend=unsloth", "train.offload_checkpoints=true",
                                                      "train.gradient_checkpointing=true"])))
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda n, *a: None if n == "unsloth" else real(n, *a))
    with pytest.raises(CellSkipped, match="pip install unsloth"):
        backends.check(c, torch.device("cuda", 0))


def test_unsloth_s_fused_lora_kernels_are_turned_off_through_its_own_switch_and_never_in_silence(monkeypatch):
    """backend.unsloth_fused_lora=false reaches Unsloth as UNSLOTH_FUSED_LORA_DROPOUT=0, set in the cell's process
    before Unsloth is imported; Unsloth honours that switch only where the adapters have dropout, so with
    lora.dropout=0 the option is refused, and the switch set in the environment against the config is refused
    too (the cell would run without the kernels while its config said they ran)."""
    from lorabench.run.checks import check_values
    from lorabench.run.worker import unsloth_environment

    def of(*over):
        return OmegaConf.to_object(compose_cfg(["backend=unsloth", *over]))

    monkeypatch.delenv("UNSLOTH_FUSED_LORA_DROPOUT", raising=False)
    assert unsloth_environment(of()) == {}
    assert unsloth_environment(of("backend.unsloth_fused_lora=false")) == {"UNSLOTH_FUSED_LORA_DROPOUT": "0"}
    check_values(of("backend.unsloth_fused_lora=false"))  # lora.dropout 0.05: Unsloth honours the switch
    with pytest.raises(ValueError, match=r"backend.unsloth_fused_lora=false with lora.dropout=0: .* give lora.dropout"):
        check_values(of("backend.unsloth_fused_lora=false", "lora.dropout=0"))
    monkeypatch.setenv("UNSLOTH_FUSED_LORA_DROPOUT", "0")
    with pytest.raises(ValueError, match=r"UNSLOTH_FUSED_LORA_DROPOUT=0 is set here.*backend.unsloth_fused_lora=false"):
        check_values(of())
    check_values(of("backend.unsloth_fused_lora=false"))  # the environment and the config agree
    check_values(of("lora.dropout=0"))  # the switch does nothing without dropout: the kernels run, as said
    check_values(of("backend=fast"))  # another backend's cell: Unsloth's switch is not its business


@pytest.mark.parametrize("model", ["gemma-2-9b", "mistral-nemo-12b"])
def test_unsloth_on_a_model_without_a_folder_tokenizer_is_skipped_by_name(monkeypatch, model):
    """Unsloth's loader reads a tokenizer from the model's folder: Gemma's ships in no package offline and
    Mistral-Nemo's Tekken file is mistral-common's own format. The cell is skipped with the reason before a
    random initialisation of many GB is drawn and saved for it (as llama's was, before its tokenizer failed);
    with model.path the checkpoint's folder is the loader's own business."""
    from lorabench.core.results import CellSkipped

    real = importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda n, *a: n == "unsloth" or real(n, *a))
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", f"model={model}"]))
    with pytest.raises(CellSkipped, match=f"model={model} has none to save there"):
        backends.check(c, torch.device("cuda", 0))
    c.model.path = "/models/checkpoint"
    backends.check(c, torch.device("cuda", 0))
    # rows of random ids read no text: the loader gets a stand-in tokenizer (next test)
    backends.check(OmegaConf.to_object(compose_cfg(["backend=unsloth", f"model={model}", "data=synthetic"])),
                   torch.device("cuda", 0))


@pytest.mark.parametrize("model", ["gemma-2-9b", "mistral-nemo-12b"])
def test_a_stand_in_tokenizer_has_the_model_s_vocabulary_and_special_ids(tmp_path, model):
    """What Unsloth's loader reads beside a random initialisation where the model's tokenizer is not offline
    (data=synthetic): as many ids as the model's embedding rows, so nothing is added or resized, and bos, eos
    and pad at the ids of its config (Mistral-Nemo's names no pad: "<pad>" at the last id, not eos's, which
    Unsloth would repair with a new token); refused without stand_in."""
    from transformers import AutoTokenizer

    from lorabench.models import hf_config

    c = OmegaConf.to_object(compose_cfg([f"model={model}", "data=synthetic"]))
    with pytest.raises(ValueError, match=f"model={model}: no tokenizer to save"):
        modeling.save_fast_tokenizer(c.model, tmp_path)
    modeling.save_fast_tokenizer(c.model, tmp_path, stand_in=True)
    tok, hf = AutoTokenizer.from_pretrained(tmp_path), hf_config(c.model)
    assert len(tok) == hf.vocab_size and (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert tok.pad_token == "<pad>" and tok.pad_token_id != tok.eos_token_id
    assert tok.pad_token_id == (hf.vocab_size - 1 if hf.pad_token_id is None else hf.pad_token_id)
    assert tok.convert_ids_to_tokens(5) == "<id_5>"


def test_a_stand_in_tokenizer_takes_the_first_of_several_eos_ids():
    """Llama-3.1's config lists three eos ids (its tokenizers extra not installed, as on a GPU machine without it,
    Unsloth's loader gets the stand-in): the first is the tokenizer's eos, the others plain words."""
    c = OmegaConf.to_object(compose_cfg(["model=llama-3.1-8b", "data=synthetic"]))
    tok = modeling.stand_in_tokenizer(c.model)
    assert tok.eos_token_id == 128001 and tok.bos_token_id == 128000 and len(tok) == 128256
    assert tok.convert_ids_to_tokens(128009) == "<id_128009>" and tok.pad_token_id == 128255


def test_unsloth_cell_runs_in_a_process_of_its_own(tmp_path, monkeypatch):
    """Unsloth patches transformers' classes on import: its cell goes to the launcher (one process,
    no torchrun), never into this one, where the next cell of a sweep would inherit the patches."""
    from lorabench.run import distributed

    calls = []
    monkeypatch.setattr(backends, "check", lambda c, device: None)  # as if installed
    monkeypatch.setattr(distributed, "launch", lambda c, run_dir, result: calls.append(c.backend.name.value) or {})
    result = run_in_process(["backend=unsloth", *FAST], tmp_path)
    assert calls == ["unsloth"] and result.status.value == "ok"


def test_saved_random_init_loads_as_the_same_model_and_tokenizer(tmp_path, monkeypatch):
    """What Unsloth's loader reads (from_pretrained on a directory): the random initialisation of
    train.seed, drawn one weight at a time as lorabench's own loads draw it (never the whole model on the device),
    and a tokenizer.json that encodes as lorabench's tokenizer does; written once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("LORABENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(modeling, "random_init", None)  # the whole model built at once: not called
    c = OmegaConf.to_object(compose_cfg(["train.seed=7"]))
    cpu = torch.device("cpu")
    torch.manual_seed(7)
    path = backends.saved_random_init(c, cpu)
    assert path.parent == tmp_path / "random_init" and not list(tmp_path.glob("random_init/*.tmp*"))
    assert (path / "generation_config.json").is_file()  # as save_pretrained would write it
    loaded = AutoModelForCausalLM.from_pretrained(path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(loaded.config)
    torch.manual_seed(7)
    fresh = {k: w[...] for k, w in modeling.random_state_dict(skeleton, cpu).items()}
    assert loaded.dtype == torch.bfloat16 and loaded.state_dict().keys() == fresh.keys()
    assert all(torch.equal(loaded.state_dict()[k], fresh[k]) for k in fresh)
    tok, ours = AutoTokenizer.from_pretrained(path), modeling.build_tokenizer(c.model)
    text = "Profile before optimising: 1.88x samples/s, tokens/s ~flat. Ünïcödé ✓"
    assert len(tok) == 32768
    assert tok(text, add_special_tokens=False).input_ids == ours.encode(text, add_special_tokens=False)
    # a model past one shard: its weights in several files and their index, loaded as one model
    shards = tmp_path / "shards"
    shards.mkdir()
    torch.manual_seed(7)
    modeling.save_random_weights(c.model, cpu, shards, shard_gib=0.001)
    index = json.loads((shards / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    sharded = AutoModelForCausalLM.from_pretrained(shards).state_dict()
    assert all(torch.equal(sharded[k], fresh[k]) for k in fresh)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert backends.saved_random_init(c, cpu) == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    other = OmegaConf.to_object(compose_cfg(["train.seed=8"]))
    assert backends.saved_random_init(other, cpu) != path  # another seed, other weights: another dir


def test_a_random_init_the_disk_cannot_hold_is_refused_before_a_weight_is_drawn(tmp_path, monkeypatch):
    """Unsloth's loader reads a saved initialisation (Gemma-4-31B's: 57 GiB in bf16): a disk with less room is
    named, with what the weights take and what is free, before anything is drawn or written, and the directory
    begun for it is removed."""
    import shutil
    from collections import namedtuple

    monkeypatch.setenv("LORABENCH_CACHE", str(tmp_path))
    c = OmegaConf.to_object(compose_cfg([]))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**40, 2**40 - 2**20, 2**20))  # 1 MiB free
    monkeypatch.setattr(modeling.RandomWeight, "__getitem__", lambda *a: pytest.fail("a weight was drawn"))
    with pytest.raises(RuntimeError, match=r"model=tiny take 0\.\d GiB in bf16 and .* has 0\.0 GiB free; give "
                                           r"data.cache_dir a disk with room, or model.path"):
        backends.saved_random_init(c, torch.device("cpu"))
    assert list((tmp_path / "random_init").iterdir()) == []


def test_a_random_init_saved_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    """Each GPU's list may start an Unsloth cell of the same model at once: each saves into a directory of
    its own, and the one that finds the initialisation saved when it is done keeps that and drops its own."""
    monkeypatch.setenv("LORABENCH_CACHE", str(tmp_path))
    c = OmegaConf.to_object(compose_cfg([]))
    saving = modeling.save_fast_tokenizer

    def other_process_done_first(model, tmp, stand_in):
        done = tmp.with_name(tmp.name.split(".tmp")[0])
        done.mkdir()
        (done / "config.json").write_text("{}")
        return saving(model, tmp, stand_in)
    monkeypatch.setattr(modeling, "save_fast_tokenizer", other_process_done_first)
    path = backends.saved_random_init(c, torch.device("cpu"))
    assert (path / "config.json").read_text() == "{}" and not (path / "model.safetensors").exists()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # this process's own save removed


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("precision", ["bf16", "nf4"])
def test_fast_path_gradients_match_hf_on_gpu(precision):
    """Every Liger op (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) and bf16 norms against hf.
    bf16 compute: a gradient's relative error of a few 2^-8 (bf16's rounding step, 0.4%) is noise;
    BF16_GRADS (3.1% of the norm) leaves room for the fp32 vs bf16 residual stream and fails a wrong
    formula."""
    cuda = torch.device("cuda", 0)
    # LoRA dropout off: its masks are random draws, and the two paths need not draw them in the same order.
    opt = ["optimizer=adamw_torch", f"precision={precision}", "train.gradient_checkpointing=true", "lora.dropout=0"]
    loss_hf, g_hf, _ = lora_grads(opt, cuda)
    loss_fast, g_fast, _ = lora_grads([*opt, "backend=fast", "data.packing=false",
                                       "train.checkpoint_fraction=0.5"], cuda)
    assert loss_fast == pytest.approx(loss_hf, rel=BF16_LOSS)
    assert_grads_close(g_fast, g_hf, BF16_GRADS)


@pytest.mark.gpu
@requires_cuda
def test_fast_cell_runs_after_and_before_hf_in_one_process(tmp_path):
    """A multirun shares one process: the fast cell's Liger patches must not leak into the hf cell."""
    from transformers.models.mistral import modeling_mistral

    before = modeling_mistral.MistralRMSNorm
    r = run_in_process(["backend=fast", "precision=nf4", "optimizer=paged_adamw_8bit", *FAST], tmp_path / "f")
    assert r.status.value == "ok", r.error
    assert read_result(tmp_path / "f")["metrics"]["data/packed_rows"] > 0
    assert modeling_mistral.MistralRMSNorm is before
    r = run_in_process(["backend=hf", "precision=nf4", "optimizer=paged_adamw_8bit", *FAST], tmp_path / "h")
    assert r.status.value == "ok", r.error
    assert all(s["loss"] == s["loss"] for s in read_steps(tmp_path / "h"))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(importlib.util.find_spec("unsloth") is None, reason="unsloth not installed")
def test_unsloth_cell_trains_in_a_process_of_its_own_on_gpu(tmp_path):
    """Unsloth's loader, LoRA and checkpointing (half the layers) on the tiny model in nf4: the cell
    trains (loss falls), in a child process: Unsloth's patches never reach this one."""
    import sys

    r = run_in_process(["backend=unsloth", "precision=nf4", "optimizer=paged_adamw_8bit", "seq_len=128",
                        "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5",
                        "train.max_steps=12", "train.untimed_steps=2", "data.max_samples=64"], tmp_path)
    assert r.status.value == "ok", r.error
    assert r.dist["nproc"] == 1 and r.model["checkpointed_layers"] == 1 and r.model["trainable"] > 0
    losses = [s["loss"] for s in read_steps(tmp_path)]
    assert len(losses) == 12 and losses[-1] < losses[0] - 1
    assert "unsloth" not in sys.modules and "Unsloth" in (tmp_path / "ranks.log").read_text()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(importlib.util.find_spec("unsloth") is None, reason="unsloth not installed")
def test_unsloth_s_tiled_mlp_trains_through_peft_s_lora_forward_on_gpu(tmp_path):
    """+experiment=max_context's Unsloth layout: its offloaded checkpointing and tiled MLP with PEFT's LoRA forward
    (backend.unsloth_fused_lora=false; Unsloth's fused LoRA MLP writes into its input in the backward, which the
    tiled MLP's backward refuses) trains, the switch set in the cell's process alone."""
    import os

    r = run_in_process(["backend=unsloth", "precision=nf4", "optimizer=paged_adamw_8bit", "seq_len=512",
                        "lora=all_linear", "train.gradient_checkpointing=true", "train.checkpoint_fraction=1",
                        "backend.unsloth_tiled_mlp=true", "backend.unsloth_fused_lora=false",
                        "train.max_steps=6", "train.untimed_steps=2", "data.max_samples=16"], tmp_path)
    assert r.status.value == "ok", r.error
    assert "UNSLOTH_FUSED_LORA_DROPOUT" not in os.environ


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(importlib.util.find_spec("unsloth") is None, reason="unsloth not installed")
def test_unsloth_cell_trains_on_packed_rows_on_gpu(tmp_path):
    """Packed rows at batch 4 reach Unsloth as one row with each sample's length (lorabench.builders.data.PackedCollator):
    laid out row by row they failed in its attention on the shapes (2026-11-26_gaps)."""
    r = run_in_process(["backend=unsloth", "precision=nf4", "optimizer=paged_adamw_8bit", "seq_len=128", "batch=4",
                        "data.packing=true", "train.max_steps=12", "train.untimed_steps=2", "data.max_samples=64"],
                       tmp_path)
    assert r.status.value == "ok", r.error
    kernel = r.model["unsloth_varlen_kernel"]  # what Unsloth's attention had: xformers, flash-attn or none
    assert kernel in ("xformers", "flash-attn", "none") and r.model["unsloth_packing"] == (kernel != "none")
    result = read_result(tmp_path)
    assert ("data/packed_rows" in result["metrics"]) == (kernel != "none")
    assert result["config"]["data"]["packing"] == (kernel != "none")  # without a kernel its rows were padded
    losses = [s["loss"] for s in read_steps(tmp_path)]
    assert len(losses) == 12 and losses[-1] < losses[0]


def fake_unsloth(monkeypatch, flash: bool, xformers: bool | None, segments: bool = False, torch_varlen: bool = False,
                 native_beats: bool = False):
    """Unsloth's flags as its modules hold them once imported (xformers None: an Unsloth without attention_dispatch,
    whose _utils.xformers is the module or None; segments: its packed SDPA route, UNSLOTH_SDPA_PACKED_SEGMENTS;
    torch_varlen: this torch's varlen_attn taken; native_beats: torch's route measured faster than xformers)."""
    import sys
    import types

    utils = types.SimpleNamespace(HAS_FLASH_ATTENTION=flash, xformers=object() if xformers else None)
    marked = []
    dispatch = types.SimpleNamespace(HAS_XFORMERS=bool(xformers), _SDPA_PACKED_SEGMENTS=segments,
                                     _TORCH_VARLEN_ATTN=object() if torch_varlen else None,
                                     _NATIVE_BEATS_XFORMERS=native_beats)
    modules = {"unsloth": types.ModuleType("unsloth"), "unsloth.models": types.SimpleNamespace(_utils=utils),
               "unsloth.models._utils": utils, "unsloth.utils": types.ModuleType("unsloth.utils"),
               "unsloth.utils.packing": types.SimpleNamespace(mark_allow_overlength=marked.append),
               "unsloth.utils.attention_dispatch": dispatch if xformers is not None else None}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return marked


@pytest.mark.parametrize("flash, xformers, segments, torch_varlen, native_beats, kernel", [
    (True, True, True, True, True, "flash-attn"), (False, True, False, False, False, "xformers"),
    (False, True, True, True, False, "xformers"), (False, True, True, True, True, "torch varlen"),
    (False, False, True, True, False, "torch varlen"), (False, False, True, False, False, "sdpa per sample"),
    (False, None, False, False, False, "none"), (False, False, False, False, False, "none")])
def test_unsloth_packs_through_its_own_path_wherever_it_has_one_but_a_dense_mask(
        monkeypatch, flash, xformers, segments, torch_varlen, native_beats, kernel):
    """Unsloth's route for packed rows as its own flags say, in its order (FlashAttention; xformers once its device
    probe passed, unless torch's route beats it; torch's varlen_attn; one SDPA call per sample); with one, packed rows
    reach it as one row with each sample's length and the model is marked to take the long row (its
    enable_sample_packing's marker); with none but a dense mask, the cell's rows are padded (data.packing=false in
    the config that ran) and the reason recorded. Rows that were never packed (data=synthetic) stay as they are."""
    marked = fake_unsloth(monkeypatch, flash, xformers, segments, torch_varlen, native_beats)
    assert backends.unsloth_varlen_kernel() == kernel
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "data.packing=true", "seq_len=64"]))
    ran, note = backends.unsloth_rows(c)
    assert note["unsloth_varlen_kernel"] == kernel and note["unsloth_packing"] == (kernel != "none")
    assert data.packs(ran) == (kernel != "none") and ("unsloth_packing_off" in note) == (kernel == "none")
    tok = modeling.build_tokenizer(c.model)
    collator = data.build_collator(ran, tok)
    assert isinstance(collator, data.PackedCollator) == (kernel != "none")
    backends.use_unsloth_packing("model", ran)
    assert marked == (["model"] if kernel != "none" else [])
    fixed, note = backends.unsloth_rows(OmegaConf.to_object(compose_cfg(["backend=unsloth", "data=synthetic"])))
    assert not data.packs(fixed) and note["unsloth_packing"] is False
    assert backends.unsloth_rows(OmegaConf.to_object(compose_cfg(["backend=hf"])))[1] == {}


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_backend_sweep_report_compares_speed_and_loss_curves(tmp_path, float64):
    """A backend sweep on CPU (fast without its CUDA kernels and without packing, so both cells see
    the same batches; run in this process, laid out as a multirun's cells): the report names each
    backend's best cell with its ratio to hf, and the loss curves agree step by step (float64, same
    math: within SAME_MATH)."""
    import re

    from lorabench.report.page import write_report

    for n, backend in enumerate(["hf", "fast"]):
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
        r = run_in_process([f"backend={backend}", "backend.liger=[]", "data.packing=false",
                            "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5", *FAST],
                           tmp_path / str(n))
        assert r.status.value == "ok", r.error
    md = write_report(tmp_path).markdown
    assert "Backends: each one's fastest cell run against hf's (unsearched)" in md and "| reference |" not in md
    rows = {m.group(1): m.group(2) for m in re.finditer(r"\| gpu=\w+ \| (hf|fast) \| padded \| b4 ckpt 0.5 offload 0 \| "
                                                      r"unsearched: fastest of 1 cell run \|(?: [^|]+ \|){5} ([^|]+) \|", md)}
    # no search here: each backend's one cell against hf's, labelled unsearched
    assert set(rows) == {"hf", "fast"} and rows["hf"] == "1.00 (1.00) vs hf b4 ckpt 0.5 offload 0 (unsearched)", rows
    assert re.fullmatch(r"[\d.]+ \([\d.]+\) vs hf b4 ckpt 0.5 offload 0 \(unsearched\)", rows["fast"]), rows
    table = md.split("Loss curves against the reference cell")[1]
    diff = re.search(r"\| backend=fast \| (\d+) \| ([\d.]+) \|", table)
    # The table's max abs diff has 4 decimals: the losses (~11) agree within SAME_MATH x 11 = 2e-5,
    # below its 5e-5 of rounding, so it reads 0.0000 (a wrong formula: differences of 0.01 and more).
    assert diff and int(diff.group(1)) == 6 and float(diff.group(2)) == 0
    assert (tmp_path / "plots" / "loss.png").stat().st_size > 0


@pytest.mark.parametrize("built", [None, "2.10.0+cu128"])
def test_unsloth_without_a_varlen_kernel_says_what_to_install(monkeypatch, tmp_path, built):
    """No varlen kernel: the recorded reason names what is missing, and where xformers is installed but was
    compiled against another torch (PyPI's wheels are built for one), that torch and this one."""
    fake_unsloth(monkeypatch, False, False)
    if built is not None:  # an xformers package whose build record names the torch it was compiled against
        (tmp_path / "xformers").mkdir()
        (tmp_path / "xformers" / "__init__.py").write_text("")
        (tmp_path / "xformers" / "cpp_lib.json").write_text(json.dumps({"version": {"torch": built}}))
        monkeypatch.syspath_prepend(str(tmp_path))
    else:
        monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name, *a: None)
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "data.packing=true", "seq_len=64"]))
    _, note = backends.unsloth_rows(c)
    why = note["unsloth_packing_off"]
    if built is None:
        assert "install xformers built for this torch, or flash-attn" in why
    else:
        assert f"built for torch {built} and this is torch {torch.__version__}" in why
    monkeypatch.setenv("UNSLOTH_SDPA_PACKED_SEGMENTS", "0")  # the route that needs no kernel, turned off by the user
    assert "UNSLOTH_SDPA_PACKED_SEGMENTS turns Unsloth's packed SDPA route off" in backends.unsloth_rows(c)[1][
        "unsloth_packing_off"]
