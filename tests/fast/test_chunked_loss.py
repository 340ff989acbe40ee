"""The loss from the hidden states in chunks (lorabench.fast.chunked_loss, backend.chunked_loss) is transformers'
causal LM loss, on every family with a row: the head's soft-cap (Gemma 4) and logit scaling (Granite) included.

transformers computes the loss on logits upcast to fp32 (ForCausalLMLoss), so both sides round in fp32 whatever the
model's dtype: in a float64 model they differ by fp32 rounding in another order. A sum of n fp32 terms carries a
relative error of about n x 2^-24 at worst (n = 256 vocabulary entries a row in a log-sum-exp here: 1.5e-5); the
tolerance 1e-4 is above that and far below what a missed soft-cap, scale or shift changes (1e-2 and more).
"""

import pytest
import torch
from conftest import tiny_config
from transformers import AutoModelForCausalLM

from lorabench.fast import chunked_loss
from lorabench.models import FAMILIES

FP32_SUMS = 1e-4


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_the_chunked_loss_is_transformers_loss(model_type, monkeypatch):
    torch.manual_seed(0)
    cfg = tiny_config(model_type, vocab_size=256, max_position_embeddings=128, use_cache=False)
    # eager experts: the grouped GEMM of transformers' MoE runs no float64
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64, attn_implementation="eager",
                                             experts_implementation="eager")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :5] = -100  # a prompt the loss skips
    hidden = model.model(input_ids=ids).last_hidden_state.detach()

    def loss_of(fn):
        h = hidden.clone().requires_grad_()
        loss = fn(h)
        loss.backward()
        return loss.item(), h.grad

    def reference(h):  # the model's own head and loss on the same hidden states
        logits = model.lm_head(h)
        if scale := getattr(model.config, "logits_scaling", None):
            logits = logits / scale
        if cap := getattr(model.config, "final_logit_softcapping", None):
            logits = torch.tanh(logits / cap) * cap
        return model.loss_function(logits, labels, vocab_size=256)

    monkeypatch.setattr(chunked_loss, "CHUNK_ROWS", 7)  # several chunks, the last one short
    loss, grad = loss_of(lambda h: chunked_loss.causal_lm_loss(model, h, labels))
    ref_loss, ref_grad = loss_of(reference)
    assert loss == pytest.approx(ref_loss, rel=FP32_SUMS)
    assert ((grad - ref_grad).norm() / ref_grad.norm()).item() < FP32_SUMS
    # num_items_in_batch (the Trainer's count over the optimizer step) divides the sum instead
    half = chunked_loss.causal_lm_loss(model, hidden, labels, num_items_in_batch=torch.tensor(50)).item()
    assert half * 50 == pytest.approx(ref_loss * (labels[:, 1:] != -100).sum().item(), rel=FP32_SUMS)


def test_the_patched_model_returns_the_loss_and_no_logits():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen3_5_text"), dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 16))
    expected = model(input_ids=ids, labels=ids).loss.item()
    chunked_loss.patch(model)
    out = model(input_ids=ids, labels=ids)
    assert out.logits is None and out.loss.item() == pytest.approx(expected, rel=FP32_SUMS)
    assert model(input_ids=ids).logits.shape == (2, 16, 512)  # without labels: the model's own forward
