"""Attention over packed rows without a mask (lorabench.fast.packed_attention, backend.varlen_attention):
the segments the collator gives, the same outputs and gradients as SDPA with transformers' packed mask."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import BF16_GRADS, BF16_LOSS, SAME_MATH, assert_grads_close, compose_cfg, lora_grads, requires_cuda
from omegaconf import OmegaConf
from transformers import MistralConfig, MistralForCausalLM

from lorabench.builders import data, modeling
from lorabench.fast import packed_attention, parts
from lorabench.run import checks


def reference_varlen(q, k, v, cu_seq_lens, longest, scale, window_left):
    """What packed_attention.flash_varlen computes (its flash kernel runs on CUDA only), segment by
    segment with SDPA's math: causal, keys within the window's left reach, 2 query heads per key head."""
    assert longest >= int(cu_seq_lens.diff().max())  # the row's width where the collator fixes the shapes
    out = torch.empty_like(q)
    for a, b in zip(cu_seq_lens[:-1].tolist(), cu_seq_lens[1:].tolist()):
        n = b - a
        if n == 0:  # an empty segment past the batch's own
            continue
        allowed = torch.ones(n, n, dtype=torch.bool).tril()
        if window_left is not None:
            allowed &= torch.ones(n, n, dtype=torch.bool).triu(-window_left)
        seg = [t[a:b].transpose(0, 1) for t in (q, k, v)]  # [heads, tokens, dim]
        out[a:b] = F.scaled_dot_product_attention(*seg, attn_mask=allowed, scale=scale,
                                                  enable_gqa=True).transpose(0, 1)
    return out


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    """The varlen path on CPU: the reference for the kernel, and the backend's CUDA condition lifted."""
    monkeypatch.setattr(packed_attention, "flash_varlen", reference_varlen)
    monkeypatch.setattr(packed_attention, "runs_on", lambda device: True)


def test_collator_gives_each_packed_sample_and_the_padding_a_segment():
    rows = data.pack([{"input_ids": [1] * n, "labels": [1] * n} for n in (5, 3, 2, 6)], seq_len=9)
    batch = data.PackedCollator(pad_id=0, width=9, segments=True)(rows)
    # Rows [6, 3] and [5, 2 | 2 pad]: a segment per sample, and one for the padding.
    assert [len(r["input_ids"]) for r in rows] == [9, 7]
    assert batch["cu_seq_lens_q"].tolist() == [0, 6, 9, 14, 16, 18]
    assert batch["cu_seq_lens_q"].dtype == torch.int32 and batch["cu_seq_lens_k"] is batch["cu_seq_lens_q"]
    assert batch["max_length_q"] == batch["max_length_k"] == 6
    assert "cu_seq_lens_q" not in data.PackedCollator(pad_id=0, width=9)(rows)


def test_fixed_shapes_give_every_batch_room_for_its_segments_and_the_row_as_longest():
    """For CUDA graphs (build_collator's `fixed`): rows padded to seq_len, offsets with room for batch x (the most
    samples a row holds + 1) segments, those past the batch's own empty (its end repeated), the longest the row's
    width; batches of other cuts in one shape. A batch of more segments than the room keeps its own offsets."""
    rows = data.pack([{"input_ids": [1] * n, "labels": [1] * n} for n in (5, 3, 2, 6)], seq_len=9)  # [6, 3], [5, 2]
    c = OmegaConf.to_object(compose_cfg(["backend=fast", "seq_len=12", "batch=2"]))

    class Tok:
        pad_token_id = 0
    fixed = data.build_collator(c, Tok(), rows, fixed=True, segments=True)
    assert (fixed.width, fixed.capacity) == (12, 2 * (2 + 1))
    assert data.build_collator(c, Tok(), rows, segments=True).capacity is None  # without graphs: each batch its own
    assert data.build_collator(c, Tok(), rows, fixed=True).capacity is None  # no varlen attention: no offsets
    cuts = fixed(rows)  # [6, 3 | 3 pad] and [5, 2 | 5 pad]: the 6 segments of room, all used
    assert cuts["input_ids"].shape == (2, 12)
    assert cuts["cu_seq_lens_q"].tolist() == [0, 6, 9, 12, 17, 19, 24]
    whole = fixed(data.pack([{"input_ids": [1] * n, "labels": [1] * n} for n in (9, 8)], seq_len=9))
    assert whole["cu_seq_lens_q"].tolist() == [0, 9, 12, 20, 24, 24, 24]  # [9 | 3 pad], [8 | 4 pad], 2 empty
    assert whole["max_length_q"] == whole["max_length_k"] == cuts["max_length_q"] == 12
    small = data.PackedCollator(0, 12, segments=True, capacity=4)(rows)
    assert small["cu_seq_lens_q"].tolist() == [0, 6, 9, 12, 17, 19, 24]  # 6 > 4: its own


def test_empty_segments_past_the_batch_s_own_change_no_logit(varlen_on_cpu):
    """The tiny Mistral through varlen attention (its reference on CPU, fp64): the collator's fixed shapes (rows of
    the width, empty segments after the batch's own) give the logits of each batch's own offsets."""
    cfg = MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_cache=False)
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).double().eval()
    packed_attention.use(model)
    rows = data.pack([{"input_ids": torch.randint(1, 64, (n,)).tolist(), "labels": [1] * n}
                      for n in (7, 5, 4, 9, 3)], seq_len=12)
    names = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    with torch.no_grad():
        own, fixed = (model(**{k: b[k] for k in names}).logits
                      for b in (data.PackedCollator(0, 12, segments=True)(rows),
                                data.PackedCollator(0, 12, segments=True, capacity=3 * len(rows))(rows)))
    assert torch.equal(own, fixed)


def test_unsloth_s_packed_batches_are_one_row_that_names_each_sample_s_length():
    """Unsloth keeps attention inside a packed sample only in a one-row batch (at batch 4 on the GPU it failed
    on the shapes): its batches are the rows laid end to end, each segment's length under packed_seq_lengths."""
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "data.packing=true", "seq_len=9"]))
    rows = data.pack([{"input_ids": [1] * n, "labels": [1] * n} for n in (5, 3, 2, 6)], seq_len=9)
    batch = data.PackedCollator(0, 9, lengths=True)(rows)
    # Rows [6, 3] and [5, 2 | 2 pad], laid end to end: the padding is a segment of its own.
    assert batch["packed_seq_lengths"].tolist() == [6, 3, 5, 2, 2]
    assert int(batch["packed_seq_lengths"].sum()) == batch["input_ids"].numel()
    rowwise = data.PackedCollator(0, 9)(rows)
    for k, v in rowwise.items():  # the same tokens, positions, labels and real-token marks, end to end
        assert batch[k].shape == (1, 18) and torch.equal(batch[k][0], v.reshape(-1))
    assert "packed_seq_lengths" not in data.PackedCollator(0, 9)(rows)

    class Tok:
        pad_token_id = 0
    assert data.build_collator(c, Tok()).lengths
    c.backend.name = type(c.backend.name)("fast")
    assert not data.build_collator(c, Tok()).lengths


@pytest.mark.parametrize("window", [None, 3])
def test_varlen_attention_equals_sdpa_with_the_packed_mask(varlen_on_cpu, window):
    """A tiny Mistral on packed rows (fp32): logits equal to SDPA's with the block-diagonal mask
    transformers builds from position_ids, also with a sliding window shorter than a sample."""
    cfg = MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
                        attn_implementation="sdpa", use_cache=False)  # as lorabench trains (with a cache,
    # transformers would not look for packed rows in position_ids)
    torch.manual_seed(0)
    sdpa = MistralForCausalLM(cfg).double().eval()  # float64: the two differ in summation order only
    varlen = MistralForCausalLM(copy.deepcopy(cfg)).double().eval()  # its own config: use() sets the attention there
    varlen.load_state_dict(sdpa.state_dict())
    packed_attention.use(varlen)
    rows = data.pack([{"input_ids": torch.randint(1, 64, (n,)).tolist(), "labels": [1] * n}
                      for n in (7, 5, 4, 9, 3)], seq_len=12)
    batch = data.PackedCollator(pad_id=0, width=12, segments=True)(rows)
    ids, pos = batch["input_ids"], batch["position_ids"]
    keys = {k: batch[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    with torch.no_grad():
        want = sdpa(input_ids=ids, position_ids=pos).logits
        got = varlen(input_ids=ids, position_ids=pos, **keys).logits
        unmasked = sdpa(input_ids=ids).logits  # one causal sequence per row: what a missed cut would give
    # What can differ is transformers' fp32 roundings (SAME_MATH), relative to the logits' size; a missed
    # cut changes the logits by the order of their size
    bound = SAME_MATH * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=bound)
    assert (unmasked - want).abs().max() > 1e4 * bound


def test_fast_cell_gradients_with_varlen_equal_the_masked_ones(varlen_on_cpu, float64):
    """The whole cell's path (collator, model kwargs, fused LoRA projections, checkpointing) on real
    chat data packed into rows: the loss and every LoRA gradient as with SDPA and its mask (float64,
    within SAME_MATH)."""
    opt = ["backend=fast", "backend.liger=[]", "train.gradient_checkpointing=true",
           "train.checkpoint_fraction=0.5", "lora.dropout=0"]
    loss_mask, g_mask, _ = lora_grads([*opt, "backend.varlen_attention=false"], torch.device("cpu"))
    loss_varlen, g_varlen, _ = lora_grads(opt, torch.device("cpu"))
    assert loss_varlen == pytest.approx(loss_mask, rel=SAME_MATH)
    assert_grads_close(g_varlen, g_mask, SAME_MATH)


def test_varlen_attention_only_where_it_runs():
    """Packed rows on CUDA only: fixed-length rows keep SDPA's causal flash path, a CPU keeps SDPA,
    and Unsloth's recipe refuses it by name."""
    cpu = torch.device("cpu")
    for overrides, device in ((["backend=fast"], cpu), (["backend=fast", "data=synthetic"], torch.device("cuda"))):
        c = OmegaConf.to_object(compose_cfg(["model.num_hidden_layers=1", "backend.liger=[]", *overrides]))
        model = modeling.random_init(c.model, cpu, torch.float32)
        model = parts.apply(model, c, device, parts.Stage.BEFORE_LORA)
        assert model.config._attn_implementation == "sdpa"
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "backend.varlen_attention=true"]))
    with pytest.raises(ValueError, match="varlen_attention=True"):
        checks.check_values(c)


@pytest.mark.gpu
@requires_cuda
def test_varlen_flash_attention_matches_the_masked_path_on_gpu():
    """PyTorch's varlen flash kernel against SDPA with the packed mask, bf16 on the GPU, the whole
    fast cell's path: the loss within bf16's rounding, every LoRA gradient within 3% of its norm
    (a wrong cut or window gives errors of the order of the gradient itself)."""
    cuda = torch.device("cuda", 0)
    opt = ["backend=fast", "precision=bf16", "optimizer=adamw_torch", "train.gradient_checkpointing=true",
           "train.checkpoint_fraction=0.5", "lora.dropout=0"]
    loss_mask, g_mask, _ = lora_grads([*opt, "backend.varlen_attention=false"], cuda)
    loss_varlen, g_varlen, _ = lora_grads(opt, cuda)
    assert loss_varlen == pytest.approx(loss_mask, rel=BF16_LOSS)
    assert_grads_close(g_varlen, g_mask, BF16_GRADS)
