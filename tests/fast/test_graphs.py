"""Decoder layers replayed as CUDA graphs (lorabench.fast.graphs, backend.cuda_graphs): a layer replays its graphs
only where its call is the captured one, each adapted projection gets its dropout seed in device memory, and on
a GPU a fast cell trains with its layers captured as it trains without (the same losses at every step)."""

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from conftest import FAST, read_steps, requires_cuda, run_in_process
from torch import nn

from lorabench.fast import graphs


def test_a_layer_replays_its_graphs_only_where_its_call_is_the_captured_one(monkeypatch):
    replays, eager = [], []
    monkeypatch.setattr(graphs._Replay, "apply", lambda slot, x, *params: replays.append((slot, x)) or "graph")
    sample = (torch.zeros(2, 3, 8, requires_grad=True), (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)))
    call = graphs._Call(nn.Linear(8, 8), lambda *a, **k: eager.append(k) or "eager", {})
    statics, slot = graphs._Statics(), graphs._Slot(x=sample[0], out=sample[0], params=(), fwd=None)
    forward = graphs._replayed(slot, call, sample[1], statics)
    pe = (torch.ones(2, 3, 4), torch.ones(2, 3, 4))
    h = torch.ones(2, 3, 8)
    assert forward(h, position_embeddings=pe, position_ids=None, cache_position=None) == "graph"
    assert replays[0] == (slot, h) and torch.equal(sample[1][0], pe[0])  # the static position embeddings loaded
    assert forward(h, position_embeddings=pe, attention_mask=torch.ones(2, 1, 3, 3)) == "eager"  # a mask
    assert forward(torch.ones(2, 5, 8), position_embeddings=(torch.ones(2, 5, 4),) * 2) == "eager"  # other shapes
    assert forward(h.half(), position_embeddings=pe) == "eager"  # another dtype
    assert forward(h, position_embeddings=pe, cu_seq_lens_q=torch.tensor([0, 3])) == "eager"  # offsets not captured
    with torch.no_grad():
        assert forward(h, position_embeddings=pe) == "eager"
    assert len(replays) == 1 and len(eager) == 5


def test_packed_rows_offsets_are_read_by_the_graphs_and_their_longest_segment_is_part_of_the_call(monkeypatch):
    """Packed rows through varlen attention: the segments' offsets are inputs the graphs read (copied into their
    static tensor, one per distinct tensor), the longest segment part of the captured call. Offsets of another
    length (more segments than the collator made room for) or another longest segment: the layer's own forward."""
    replays, eager = [], []
    monkeypatch.setattr(graphs._Replay, "apply", lambda slot, x, *params: replays.append(x) or "graph")
    pe, cu = (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)), torch.tensor([0, 3, 6, 6], dtype=torch.int32)
    kwargs = {"position_embeddings": pe, "position_ids": None, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
              "max_length_q": 3, "max_length_k": 3}
    assert graphs._refusal(kwargs) is None
    assert [t is u for t, u in zip(graphs._inputs(kwargs), (*pe, cu, cu))] == [True] * 4
    call = graphs._Call(nn.Linear(8, 8), lambda *a, **k: eager.append(k) or "eager", graphs._static(kwargs),
                        graphs.BOUNDARIES)
    assert call.static == {"max_length_q": 3, "max_length_k": 3}
    statics, x = graphs._Statics(), torch.zeros(2, 3, 8, requires_grad=True)
    inputs = statics.static(graphs._inputs(kwargs))
    assert inputs[2] is inputs[3]  # one tensor for q and k: one static copy
    forward = graphs._replayed(graphs._Slot(x=x, out=x, params=(), fwd=None), call, inputs, statics)
    h, new = torch.ones(2, 3, 8), torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    assert forward(h, **{**kwargs, "cu_seq_lens_q": new, "cu_seq_lens_k": new}) == "graph"
    assert inputs[2].tolist() == [0, 2, 3, 6]  # the batch's offsets, where the graphs read them
    more = torch.tensor([0, 1, 2, 3, 6], dtype=torch.int32)
    assert forward(h, **{**kwargs, "cu_seq_lens_q": more, "cu_seq_lens_k": more}) == "eager"
    assert forward(h, **{**kwargs, "max_length_q": 2, "max_length_k": 2}) == "eager"
    assert len(replays) == 1 and len(eager) == 2


def test_each_chain_of_captured_layers_starts_from_input_memory_of_its_own(monkeypatch):
    """Layers captured around offloaded ones (recomputed and offloaded layers interleave: offload.layer_plan) form
    chains; each chain's first layer reads its input from memory of its own, which its backward reads again (its
    saved input, or where its recomputation starts). They once shared the probe's one sample tensor: the last
    chain's forward overwrote the others' inputs before their backward, and every cell with layers both recomputed
    and offloaded trained on wrong LoRA gradients (on packed ShareGPT its loss fell to 10.24 where the same cell
    without graphs, and hf's, reached 9.83). Consecutive layers share: a layer's input is the previous output."""
    class Graph:  # the capture runs each call once, eagerly: what it allocates is what a capture would
        def replay(self):
            pass
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    layers = [nn.Linear(8, 8) for _ in range(4)]
    calls = [graphs._Call(layer, lambda h, position_embeddings, layer=layer: layer(h), {}) for layer in layers]
    sample = (torch.zeros(2, 8, requires_grad=True), (torch.zeros(1), torch.zeros(1)))  # the probe's one tensor
    # captured: layers 0, 1, 3 and 5 of six, 2 and 4 offloaded; 0 and 3 recomputed
    slots = graphs._capture_chain(calls, [sample] * 4, [True, False, False], False, [True, False, True, False])
    assert slots[1].x.data_ptr() == slots[0].out.data_ptr()
    starts = [slots[i].x.data_ptr() for i in (0, 2, 3)]
    assert len(set(starts)) == 3


def test_a_recomputed_layer_that_runs_its_own_forward_is_checkpointed_as_before_its_capture(monkeypatch):
    """Its graphs recompute it, so its checkpointing wrapper is off; a call that is not the captured one (another
    shape) runs its forward through torch's checkpoint, as the wrapper did; without gradients, plainly."""
    checkpointed = []
    monkeypatch.setattr(graphs, "checkpoint", lambda fn, *a, use_reentrant, **k: checkpointed.append(a) or fn(*a, **k))
    sample = (torch.zeros(2, 3, 8, requires_grad=True), (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)))
    call = graphs._Call(nn.Linear(8, 8), lambda *a, **k: "eager", {})
    slot = graphs._Slot(x=sample[0], out=sample[0], params=(), fwd=None, recompute=True)
    forward = graphs._replayed(slot, call, sample[1], graphs._Statics())
    other = (torch.ones(2, 5, 8), (torch.ones(2, 5, 4),) * 2)
    assert forward(other[0], position_embeddings=other[1]) == "eager" and len(checkpointed) == 1
    with torch.no_grad():
        assert forward(other[0], position_embeddings=other[1]) == "eager" and len(checkpointed) == 1


def test_position_embeddings_are_copied_once_per_forward_into_the_static_pair_the_layers_share(monkeypatch):
    copies = []
    cos, sin = torch.zeros(4), torch.zeros(4)
    statics = graphs._Statics()
    pair = statics.static((cos, sin))
    assert statics.static((cos, sin)) is not pair and all(a is b for a, b in zip(statics.static((cos, sin)), pair))
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: copies.append(src) or self)
    step1 = (torch.ones(4), torch.ones(4))
    for _ in range(3):  # three layers of one forward: one copy each
        statics.load(pair, step1)
    assert len(copies) == 2
    statics.load(pair, (torch.ones(4), torch.ones(4)))  # the next forward's tensors: copied again
    assert len(copies) == 4


def test_a_flex_mask_that_depends_on_shapes_alone_is_part_of_the_captured_call(monkeypatch):
    """transformers' causal and sliding-window block masks over rows without padding have one key per shape
    and window; a padded batch's mask reads the batch (its key is False: the layer is not captured)."""
    from transformers import masking_utils as mu

    monkeypatch.setattr(mu, "_is_torch_greater_or_equal_than_2_6", False)  # masks built uncompiled (30 s on CPU)

    def mask(length=128, window=None, attention_mask=None):
        fn = mu.sliding_window_causal_mask_function(window) if window else mu.causal_mask_function
        return mu.flex_attention_mask(2, length, length, mask_function=fn, attention_mask=attention_mask)

    ones = torch.ones(2, 128, dtype=torch.bool)
    key = graphs.mask_key(mask(attention_mask=ones))
    assert key and key == graphs.mask_key(mask())  # two builds, one key
    assert graphs.mask_key(mask(window=64)) not in (key, False)
    assert graphs.mask_key(mask(window=64)) != graphs.mask_key(mask(window=32))
    assert graphs.mask_key(mask(length=256)) != key
    padded = ones.clone()
    padded[1, 100:] = False
    assert graphs.mask_key(mask(attention_mask=padded)) is False
    assert graphs._refusal({"attention_mask": mask(attention_mask=padded), "position_embeddings": ()}).startswith(
        "an attention mask that depends on the batch")
    assert graphs._refusal({"attention_mask": mask(), "position_embeddings": ()}) is None
    assert graphs.mask_key(None) is None and graphs.mask_key(torch.ones(2, 1, 4, 4)) is False


def test_each_adapted_projection_gets_its_dropout_seed_in_device_memory():
    from peft import LoraConfig, get_peft_model

    from lorabench.fast import fused

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = nn.Module(), nn.Module()
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(self.self_attn, n, nn.Linear(8, 8, bias=False))
            for n in ("gate_proj", "up_proj", "down_proj"):
                setattr(self.mlp, n, nn.Linear(8, 8, bias=False))
            self.mlp.act_fn = nn.SiLU()

    model = get_peft_model(nn.Sequential(Layer(), Layer()), LoraConfig(r=2, target_modules=["q_proj", "k_proj",
                                                                                          "v_proj", "o_proj"]))
    layers = list(model.base_model.model)
    fused.patch_attention(layers, seeded_dropout=True)
    fused.patch_mlp(layers, seeded_dropout=True)
    seeds = graphs._seed_slots(layers, torch.device("cpu"))
    assert seeds.shape == (8,) and seeds.dtype == torch.int64  # 2 layers x q, k, v, o; the MLP has no adapter
    slots = [layer.self_attn.lorabench_qkv[0].lora.lorabench_seed for layer in layers]
    assert all(s.data_ptr() != slots[0].data_ptr() or i == 0 for i, s in enumerate(slots))
    g = graphs.Graphs(seeds=seeds)
    before = seeds.clone()
    g.before_step()
    assert not torch.equal(seeds, before) and slots[0].shape == (1,)  # drawn again in place: the slots see it
    assert fused._is_seed(slots[0]) and not fused._is_seed(torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_the_probe_records_each_layer_s_call_and_stops_before_the_head(model_type):
    """The capture's probe: every layer's keyword arguments as the model passes them (Gemma-2's masks differ from
    one layer to the next), one hidden-states tensor for all of them (the first layer's input: a sample), and no
    logits: the final norm and the head never run (at batch 32 x 1,024 tokens, Qwen2.5's head would allocate
    18.6 GiB of fp32 logits)."""
    from test_fast_arch import SEQ, arch_config
    from transformers import AutoModelForCausalLM

    config = arch_config(model_type)
    config.num_hidden_layers = 3
    if model_type == "gemma2":
        config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    model = AutoModelForCausalLM.from_config(config).eval()
    layers = list(model.model.layers)
    headed = []
    model.lm_head.register_forward_hook(lambda *a: headed.append(1))
    model.model.norm.register_forward_hook(lambda *a: headed.append(1))
    ids = torch.randint(0, config.vocab_size, (2, SEQ))
    with torch.no_grad():
        embedded = model.model.embed_tokens(ids)
    seen = graphs._probe(model, {"input_ids": ids}, layers)
    assert not headed and all(s is not None for s in seen)
    assert all(s[0] is seen[0][0] for s in seen)
    assert torch.equal(seen[0][0], embedded)  # the first layer's input (Gemma's embedding scales its own)
    assert all("position_embeddings" in s[1] for s in seen)
    if model_type == "gemma2":  # each layer its mask (sliding, full, sliding), kept as the model passed it
        masks = [s[1]["attention_mask"] for s in seen]
        assert masks[0] is not None and torch.equal(masks[0], masks[2])
        assert masks[1] is None or not torch.equal(masks[0], masks[1])  # full attention: causal, no window
    assert not any(layer._forward_pre_hooks for layer in layers)  # the probe's hooks removed


@pytest.mark.gpu
@requires_cuda
def test_a_fast_cell_trains_with_its_layers_captured_as_without_on_gpu(tmp_path, monkeypatch):
    """The tiny model in nf4, fast, fixed-length rows, LoRA dropout off (its seeds are drawn on the device with
    graphs, on the host without): both layers captured, and every step's loss with them replayed as graphs equals
    the loss without within two bf16 roundings."""
    captured = []
    real = graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda *a, **k: captured.append(real(*a, **k)) or captured[-1])
    # fixed-length rows without padding: the layers get no attention mask (a padded batch gets one: no capture)
    common = ["backend=fast", "precision=nf4", "optimizer=paged_adamw_8bit", "data=synthetic", *FAST]
    losses = {}
    for on in (False, True):
        r = run_in_process([*common, f"backend.cuda_graphs={on}", "lora.dropout=0"], tmp_path / str(on))
        assert r.status.value == "ok", r.error
        losses[on] = [s["loss"] for s in read_steps(tmp_path / str(on))]
    assert len(captured) == 1 and captured[0].layers == 2  # the tiny model's 2 layers
    for a, b in zip(losses[True], losses[False]):
        assert a == pytest.approx(b, rel=2 * torch.finfo(torch.bfloat16).eps)


def test_the_record_counts_the_graphs_memory_that_no_tensor_owns_in_the_peak_allocated():
    """A replay allocates nothing through the caching allocator: what the graphs hold that no tensor owns (their
    activations) is added; the pool's tensors the layers return are in the allocator's count already."""
    g = graphs.Graphs(layers=28, pool_bytes=3 * 2**30, unowned_bytes=2 * 2**30)
    assert g.metrics({"mem/peak_allocated_gib": 8.5}) == {"graphs/layers": 28, "mem/graph_pool_gib": 3.0,
                                                           "mem/peak_allocated_gib": 10.5}
    assert g.metrics({}) == {"graphs/layers": 28, "mem/graph_pool_gib": 3.0}


def test_graphs_with_several_processes_are_turned_off_in_fast_or_refused_by_name_before_they_start(monkeypatch):
    """backend=fast has cuda_graphs on: a cell of several processes (DDP, or FSDP with the parts it refuses off)
    runs without it, its fit recording why (fit_parts); with backend.fit_parts=false it is refused before any
    process starts. A MoE model and backend.compile=true turn it off too; one process keeps it."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.core.results import CellSkipped
    from lorabench.fast import parts

    unsharded = ["backend.fused_lora=false", "backend.fused_mlp=false", "backend.fused_linear=false",
                 "backend.flat_optimizer=false"]
    monkeypatch.setattr(parts, "hf_config", lambda c: None)
    monkeypatch.setattr(parts, "features", lambda hf: feats)
    dense = parts.Features("llama", False, False, False, None, "silu", False, False, 1.0, False, 0.0, 128)
    for parallel, more in (("ddp", []), ("fsdp", unsharded)):
        overrides = ["backend=fast", "train.nproc=2", f"train.parallel={parallel}", *more]
        c = OmegaConf.to_object(compose_cfg(overrides))
        assert c.backend.cuda_graphs and c.backend.fit_parts
        parts.check_sharded(c)  # not refused: each process turns it off
        feats = dense
        fitted, off = parts.fit(c)
        assert not fitted.backend.cuda_graphs
        assert off["backend.cuda_graphs=false"] == ("cuda_graphs captures each decoder layer on one GPU (DDP's "
                                                    "gradient hooks and FSDP's gathers are not captured); this cell "
                                                    "runs 2 processes")
        strict = OmegaConf.to_object(compose_cfg([*overrides, "backend.fit_parts=false"]))
        with pytest.raises(CellSkipped, match=r"backend=fast: cuda_graphs captures each decoder layer on one GPU "
                                              r".*this cell runs 2 processes \(use backend.cuda_graphs=false\)"):
            parts.check_sharded(strict)
    one = OmegaConf.to_object(compose_cfg(["backend=fast"]))
    parts.check_sharded(one)
    assert parts.fit(one)[0].backend.cuda_graphs  # the dense model on one process: kept
    feats = dataclasses.replace(dense, model_type="mixtral", moe=True)
    assert "routes each batch's tokens to experts" in parts.fit(one)[1]["backend.cuda_graphs=false"]
    feats = dense
    compiled = OmegaConf.to_object(compose_cfg(["backend=fast", "backend.compile=true"]))
    assert "backend.compile=true compiles them" in parts.fit(compiled)[1]["backend.cuda_graphs=false"]


def fast_lora_model(base, c, device):
    """`base` through the fast cell's steps (its parts before and after LoRA, checkpointing per c.train), in train
    mode, LoRA's B drawn at random (PEFT's B = 0 would leave A without a gradient). Inside parts.around_cell."""
    from lorabench.builders import modeling
    from lorabench.fast import parts
    from lorabench.run import backends

    model = parts.apply(base, c, device, parts.Stage.BEFORE_LORA)
    model = modeling.apply_lora(model, c.lora, c.precision.name, False, c.backend.upcast_fp32)
    model = parts.apply(model, c, device, parts.Stage.AFTER_LORA)
    backends.apply_checkpointing(model, c.train, device)
    model.train()
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05, generator=torch.Generator(device).manual_seed(1))
    return model


def loss_and_grads(model, **inputs) -> tuple[float, dict]:
    """One bf16 step's loss and every trainable parameter's gradient (float64 copies), the gradients then cleared."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.double().clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("model_type,dropout,recomputed", [("llama", 0, 0), ("gemma2", 0, 0), ("qwen3", 0, 0),
                                                           ("llama", 0.5, 0), ("llama", 0, 0.5), ("gemma2", 0, 0.5)])
def test_captured_layers_compute_the_eager_step_in_shared_memory_on_gpu(model_type, dropout, recomputed):
    """A tiny bf16 model through the fast path (Gemma-2: soft-capped attention as flex attention, its causal and
    sliding-window block masks part of the captured calls), two micro-batches accumulated: with its layers
    replayed as graphs, the losses and every LoRA gradient are the eager step's within one bf16 rounding of
    the norm (2^-8), at two steps; consecutive layers share their hidden states and gradients in memory.
    With one of the two layers recomputed (checkpointed in the eager step), its backward graph computes its
    forward again. With LoRA dropout the graphs read their seeds from device memory: the same seeds give the
    same step, new seeds (Graphs.before_step) other masks."""
    from test_fast_arch import REFUSED, build, cfg

    from lorabench.fast import parts

    cuda = torch.device("cuda", 0)
    c = cfg("backend=fast", "data.packing=false", f"lora.dropout={dropout}", "precision=bf16",
            "lora.target_modules=[all-linear]",
            f"train.gradient_checkpointing={recomputed > 0}", f"train.checkpoint_fraction={recomputed or 1}",
            *REFUSED.get(model_type, ("", []))[1])
    base = build(model_type, torch.bfloat16, cuda)
    if model_type != "gemma2":  # build's eager attention takes a mask tensor (not captured); a cell's takes none
        base.set_attn_implementation("sdpa")
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 256, (2, 16), generator=g).to(cuda) for _ in range(2)]
    with parts.around_cell(c, base.config):
        model = fast_lora_model(base, c, cuda)

        def step():
            losses = []
            for ids in batches:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.item())
            grads = {n: p.grad.double().clone() for n, p in model.named_parameters() if p.requires_grad}
            model.zero_grad(set_to_none=True)
            return losses, grads

        eager = step() if dropout == 0 else None
        layers = parts.decoder_layers(model)
        again = [layer.gradient_checkpointing for layer in layers]
        assert sum(again) == round(recomputed * len(layers))
        captured = graphs.capture(model, {"input_ids": batches[0], "labels": batches[0]}, layers,
                                  [layer.lorabench_kept for layer in layers], torch.bfloat16, accumulate=True,
                                  recompute=again)
        assert captured.layers == len(layers) == 2
        assert [s.recompute for s in captured.slots] == again and not any(x.gradient_checkpointing for x in layers)
        low, high = captured.slots
        assert high.x.data_ptr() == low.out.data_ptr() and low.grad_out is high.grads[0]  # shared, not copied
        assert high.grad_out is low.grads[0]  # two gradient buffers, alternating
        if dropout:
            seeds = captured.seeds.clone()
            first, again = step(), (captured.seeds.copy_(seeds), step())[1]
            captured.before_step()
            other = step()
            # the same masks: one bf16 rounding at most (attention's backward may sum in another order); other
            # masks at p = 0.5: half the adapters' inputs zeroed, a change of their gradients' own size
            assert all((again[1][n] - g).norm() <= 2**-8 * g.norm() for n, g in first[1].items())
            assert any((other[1][n] - g).norm() > 0.1 * g.norm() for n, g in first[1].items() if "lora_A" in n)
            return
        for _ in range(2):
            replayed = step()
            assert replayed[0] == pytest.approx(eager[0], rel=2**-8)
            for n, ref in eager[1].items():
                assert (replayed[1][n] - ref).norm() <= 2**-8 * ref.norm(), n


@pytest.mark.gpu
@requires_cuda
def test_captured_layers_around_an_uncaptured_one_compute_the_eager_step_on_gpu():
    """Three layers, the middle one not captured (as an offloaded layer is not): two chains, the first layer's and
    the third's, each starting from input memory of its own, and the loss and every LoRA gradient of each batch with
    the graphs replayed are the eager step's within one bf16 rounding of the norm (2^-8). With the two chains' inputs
    in one buffer (before 0e26623) the third layer's forward overwrote the first one's saved input."""
    from test_fast_arch import build, cfg

    from lorabench.fast import parts

    cuda = torch.device("cuda", 0)
    c = cfg("backend=fast", "data.packing=false", "lora.dropout=0", "precision=bf16", "lora.target_modules=[all-linear]",
            "train.gradient_checkpointing=false")
    base = build("llama", torch.bfloat16, cuda, layers=3)
    base.set_attn_implementation("sdpa")  # build's eager attention takes a mask tensor (not captured)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 256, (2, 16), generator=g).to(cuda) for _ in range(2)]
    with parts.around_cell(c, base.config):
        model = fast_lora_model(base, c, cuda)

        def step(ids):
            return loss_and_grads(model, input_ids=ids, labels=ids)

        eager = [step(ids) for ids in batches]
        layers = parts.decoder_layers(model)
        captured = graphs.capture(model, {"input_ids": batches[0], "labels": batches[0]}, layers,
                                  [True, False, True], torch.bfloat16)
        assert captured.layers == 2 and captured.slots[0].x.data_ptr() != captured.slots[1].x.data_ptr()
        for ids, (loss, grads) in zip(batches, eager):
            got = step(ids)
            assert got[0] == pytest.approx(loss, rel=2**-8)
            for n, ref in grads.items():
                assert (got[1][n] - ref).norm() <= 2**-8 * ref.norm(), n


@pytest.mark.gpu
@requires_cuda
def test_packed_rows_replayed_as_graphs_compute_the_eager_step_on_gpu(caplog):
    """Packed rows through varlen flash attention in the collator's fixed shapes (rows of seq_len tokens, room
    for batch x (most samples in a row + 1) segments): the empty segments past a batch's own change nothing in the
    eager step, and with the layers captured at the first batch, three batches of other cuts replay their graphs
    (none runs its own forward) with the eager step's loss and LoRA gradients within one bf16 rounding of the
    norm (2^-8)."""
    from test_fast_arch import build, cfg

    from lorabench.builders import data
    from lorabench.fast import parts

    cuda = torch.device("cuda", 0)
    c = cfg("backend=fast", "precision=bf16", "lora.dropout=0", "lora.target_modules=[all-linear]", "seq_len=16",
            "batch=2", "train.gradient_checkpointing=false")
    g = torch.Generator().manual_seed(3)
    samples = [[{"input_ids": ids, "labels": ids} for n in lengths
                for ids in [torch.randint(1, 256, (n,), generator=g).tolist()]]
               for lengths in ((9, 7, 5, 4), (16, 3, 3, 3, 2), (12, 4, 10))]
    rows = [data.pack(s, 16) for s in samples]  # two rows each: [9, 7] [5, 4]; [16] [3, 3, 3, 2]; [12, 4] [10]
    assert all(len(r) == 2 for r in rows)
    own = data.PackedCollator(0, 16, segments=True)
    fixed = data.build_collator(c, SimpleNamespace(pad_token_id=0), [r for rs in rows for r in rs], fixed=True,
                                segments=True)
    assert fixed.capacity == 2 * (4 + 1) and fixed.width == 16
    base = build("llama", torch.bfloat16, cuda)
    with parts.around_cell(c, base.config):
        model = fast_lora_model(base, c, cuda)  # varlen attention (packed rows, CUDA); none recomputed: each kept

        def step(batch):
            return loss_and_grads(model, **{k: v.to(cuda) if isinstance(v, torch.Tensor) else v
                                            for k, v in batch.items() if k != data.REAL_TOKENS})

        def close(a, b):
            return a[0] == pytest.approx(b[0], rel=2**-8) and all(
                (a[1][n] - ref).norm() <= 2**-8 * ref.norm() for n, ref in b[1].items())

        eager = [step(own(r)) for r in rows]
        assert all(close(step(fixed(r)), e) for r, e in zip(rows, eager))  # the empty segments change nothing
        layers = parts.decoder_layers(model)
        first = {k: v.to(cuda) if isinstance(v, torch.Tensor) else v for k, v in fixed(rows[0]).items()
                 if k != data.REAL_TOKENS}
        captured = graphs.capture(model, first, layers, [layer.lorabench_kept for layer in layers], torch.bfloat16)
        assert captured.layers == len(layers) == 2
        with caplog.at_level("INFO", logger="lorabench.fast.graphs"):
            replayed = [step(fixed(r)) for r in rows]
        assert "ran its own forward" not in caplog.text
        assert all(close(r, e) for r, e in zip(replayed, eager))
