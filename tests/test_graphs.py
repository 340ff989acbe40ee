"""Decoder layers replayed as CUDA graphs (lorabench.graphs, backend.cuda_graphs): a layer replays its graphs
only where its call is the captured one, each adapted projection gets its dropout seed in device memory, and on
a GPU a fast cell trains with its layers captured as it trains without (the same losses at every step)."""

import pytest
import torch
from torch import nn

from conftest import FAST, read_steps, requires_cuda, run_in_process
from lorabench import graphs


def test_a_layer_replays_its_graphs_only_where_its_call_is_the_captured_one():
    sample = (torch.zeros(2, 3, 8, requires_grad=True), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    calls, eager = [], []
    forward = graphs._replayed(lambda *a: calls.append(a) or "graph", lambda *a, **k: eager.append(k) or "eager",
                               sample)
    pe = (torch.ones(2, 3, 4), torch.ones(2, 3, 4))
    h = torch.ones(2, 3, 8)  # the first layer's input may not require a gradient: the graph's input does
    assert forward(h, position_embeddings=pe, position_ids=None, cache_position=None) == "graph"
    assert calls[0][0].requires_grad and torch.equal(calls[0][0], h) and calls[0][1] is pe[0]
    assert forward(h, position_embeddings=pe, attention_mask=torch.ones(2, 1, 3, 3)) == "eager"  # a mask
    assert forward(torch.ones(2, 5, 8), position_embeddings=(torch.ones(2, 5, 4),) * 2) == "eager"  # other shapes
    assert forward(h.half(), position_embeddings=pe) == "eager"  # another dtype
    assert forward(h, position_embeddings=pe, cu_seq_lens_q=torch.tensor([0, 3])) == "eager"  # packed rows
    with torch.no_grad():
        assert forward(h, position_embeddings=pe) == "eager"
    assert len(calls) == 1 and len(eager) == 5


def test_each_adapted_projection_gets_its_dropout_seed_in_device_memory():
    from peft import LoraConfig, get_peft_model

    from lorabench import fused

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


@pytest.mark.gpu
@requires_cuda
def test_a_fast_cell_trains_with_its_layers_captured_as_without_on_gpu(tmp_path, monkeypatch):
    """The tiny model in nf4, fast, fixed-length rows, LoRA dropout off (its seeds are drawn on the device with
    graphs, on the host without): both layers captured, and every step's loss with them replayed as graphs equals
    the loss without within two bf16 roundings; with dropout on, its masks take part (the losses differ)."""
    captured = []
    real = graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda *a, **k: captured.append(real(*a, **k)) or captured[-1])
    # fixed-length rows without padding: the layers get no attention mask (a padded batch gets one: no capture)
    common = ["backend=fast", "precision=nf4", "optimizer=paged_adamw_8bit", "data=synthetic", *FAST]
    losses = {}
    for on, dropout in ((False, 0), (True, 0), (True, 0.1)):
        d = tmp_path / f"{on}_{dropout}"
        r = run_in_process([*common, f"backend.cuda_graphs={on}", f"lora.dropout={dropout}"], d)
        assert r.status.value == "ok", r.error
        losses[on, dropout] = [s["loss"] for s in read_steps(d)]
    assert len(captured) == 2 and all(g.layers == 2 for g in captured)  # the tiny model's 2 layers
    for a, b in zip(losses[True, 0], losses[False, 0]):
        assert a == pytest.approx(b, rel=2 * torch.finfo(torch.bfloat16).eps)
    # with dropout (seeds drawn on the device at every step) the masks take part: finite losses, not dropout 0's
    assert all(x == x for x in losses[True, 0.1]) and losses[True, 0.1][1:] != losses[True, 0][1:]


def test_the_record_counts_the_graphs_pool_in_the_peak_allocated():
    """A replay allocates nothing through the caching allocator: the pool the capture reserved is added."""
    g = graphs.Graphs(layers=28, pool_bytes=3 * 2**30)
    assert g.metrics({"mem/peak_allocated_gib": 8.5}) == {"graphs/layers": 28, "mem/graph_pool_gib": 3.0,
                                                           "mem/peak_allocated_gib": 11.5}
    assert g.metrics({}) == {"graphs/layers": 28, "mem/graph_pool_gib": 3.0}


def test_graphs_with_several_processes_are_refused_by_name_before_they_start():
    from omegaconf import OmegaConf

    from conftest import compose_cfg
    from lorabench import fastpath
    from lorabench.results import CellSkipped

    unsharded = ["backend.fused_lora=false", "backend.fused_mlp=false", "backend.flat_optimizer=false"]
    for parallel, match, more in (("ddp", "cuda_graphs captures each decoder layer on one GPU", []),
                                  ("fsdp", "cuda_graphs captures each layer's forward and backward on one GPU",
                                   unsharded)):  # (the parts FSDP refuses first, off)
        c = OmegaConf.to_object(compose_cfg(["backend=fast", "backend.cuda_graphs=true", "train.nproc=2",
                                             f"train.parallel={parallel}", *more]))
        with pytest.raises(CellSkipped, match=match):
            fastpath.check_sharded(c)
    fastpath.check_sharded(OmegaConf.to_object(compose_cfg(["backend=fast", "backend.cuda_graphs=true"])))
