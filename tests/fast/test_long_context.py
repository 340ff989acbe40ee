"""The memory parts for long rows compute the same model: recomputed layers from inputs held on the host
(train.offload_checkpoints) and the MLP in tiles of tokens (backend.tiled_mlp), against the same cell without
them, in float64 on CPU (every difference is round-off: SAME_MATH), LoRA dropout on (the recompute must draw the
forward's masks again)."""

import pytest
import torch
from conftest import SAME_MATH, assert_grads_close, lora_grads

from lorabench.fast import offload, tiled

CPU = torch.device("cpu")
RECOMPUTED = ["train.gradient_checkpointing=true", "train.checkpoint_fraction=1", "lora.dropout=0.1",
              "lora.target_modules=[all-linear]"]


def test_layers_recomputed_from_host_inputs_train_as_checkpointed_ones(float64, monkeypatch):
    sent = []
    real = offload.HostCheckpoints.send
    monkeypatch.setattr(offload.HostCheckpoints, "send", lambda self, h: sent.append(h.shape) or real(self, h))
    loss_ref, g_ref, _ = lora_grads(RECOMPUTED, CPU)
    loss, g, checkpointed = lora_grads([*RECOMPUTED, "train.offload_checkpoints=true"], CPU)
    assert sent and len(sent) == checkpointed == 2  # each of the tiny model's layers, its input once
    assert loss == pytest.approx(loss_ref, rel=SAME_MATH)
    assert_grads_close(g, g_ref, SAME_MATH)


@pytest.mark.parametrize("backend", [["backend=hf"], ["backend=fast", "backend.liger=[]"]])
def test_the_mlp_in_tiles_trains_as_the_whole_mlp(float64, monkeypatch, backend):
    tiles = []
    real = tiled._Tiled.forward
    monkeypatch.setattr(tiled._Tiled, "forward", staticmethod(lambda ctx, f, t, x: tiles.append(x.shape[-2] // t)
                                                               or real(ctx, f, t, x)))
    # LoRA dropout 0: a tile draws its masks for its own tokens, other draws than one over the whole row
    cell = [*RECOMPUTED, *backend, "data.packing=false", "lora.dropout=0"]
    loss_ref, g_ref, _ = lora_grads(cell, CPU)
    # (tiled_mlp is a fast part; on hf the cell's model is patched alike by the test, as fast would)
    loss, g, _ = lora_grads([*cell, "backend.tiled_mlp=8"], CPU) if "backend=fast" in backend else \
        _hf_tiled(cell, monkeypatch)
    assert tiles and all(n >= 2 for n in tiles)  # rows of the batch's longest sample (~40 tokens) in tiles of 8
    assert loss == pytest.approx(loss_ref, rel=SAME_MATH)
    assert_grads_close(g, g_ref, SAME_MATH)


def test_layers_recomputed_from_host_inputs_run_their_mlp_in_tiles_in_the_forward_too(float64, monkeypatch):
    """With the inputs on the host, a layer's forward runs without autograd (the recompute builds its graph): the
    MLP there is tiled as well, so no [tokens x intermediate] tensor of the whole row exists, and LoRA dropout draws
    the masks its recompute draws again: the loss and gradients are those of the same tiled cell recomputed on
    the GPU (a forward over the whole row would draw other masks than the tiles' recompute)."""
    seen, real = [], tiled.patch_mlps

    def patch_and_watch(layers, tile):  # every call of each MLP's own forward: how many tokens it got
        n = real(layers, tile)
        for layer in layers:
            f = layer.mlp.lorabench_mlp_forward
            layer.mlp.lorabench_mlp_forward = lambda x, f=f: seen.append(x.shape[-2]) or f(x)
        return n

    monkeypatch.setattr(tiled, "patch_mlps", patch_and_watch)
    cell = [*RECOMPUTED, "backend=fast", "backend.liger=[]", "data.packing=false", "backend.tiled_mlp=8"]
    loss_ref, g_ref, _ = lora_grads(cell, CPU)
    seen.clear()
    loss, g, _ = lora_grads([*cell, "train.offload_checkpoints=true"], CPU)
    assert seen and max(seen) <= 8  # every call of the MLP: one tile of tokens at most
    assert loss == pytest.approx(loss_ref, rel=SAME_MATH)
    assert_grads_close(g, g_ref, SAME_MATH)


def _hf_tiled(cell, monkeypatch):
    from lorabench.run import backends

    real = backends.apply_checkpointing

    def tiled_then_checkpointed(model, train, device):
        tiled.patch_mlps(backends.decoder_layers(model), 8)
        return real(model, train, device)

    monkeypatch.setattr(backends, "apply_checkpointing", tiled_then_checkpointed)
    return lora_grads(cell, CPU)


def test_offload_checkpoints_needs_a_recomputed_layer_and_one_process():
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    for extra, message in ((["train.gradient_checkpointing=false"], "no layer is recomputed"),
                           (["train.gradient_checkpointing=true", "train.nproc=2"], "runs one process")):
        with pytest.raises(ValueError, match=message):
            OmegaConf.to_object(compose_cfg(["train.offload_checkpoints=true", *extra]))
