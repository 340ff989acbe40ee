"""The loss head alone, forward and backward, as under LoRA (the head frozen, its input's gradient
wanted): hidden states [rows x hidden] -> logits [rows x vocab] -> mean cross-entropy, per model shape
(conf/model: Mistral's 32,768-word vocabulary, Llama-3's 128,256, Qwen's ~152k, Gemma-2's 256,000) and
per implementation:
  liger C    Liger's fused linear cross-entropy with chunk_mem_const C (backend.ce_chunk_mem): chunks
             of next_pow2(rows / ceil(vocab / (C x hidden))) rows, each chunk's logits computed, turned
             into their gradient in place and multiplied back into the input's gradient
  torch      bf16 logits, then F.cross_entropy on fp32 logits (transformers' loss; hf's head)
  unsloth    unsloth_zoo's fused CE, chunked by its own memory target (--unsloth; unsloth imported first)
Prints CSV: model,hidden,vocab,rows,impl,ms,extra_mib,loss_err,grad_err (ms: mean of 10 calls after 3,
CUDA events; extra_mib: peak allocated during one call above what was allocated before it; loss_err and
grad_err: against torch's fp32 loss of the same bf16 logits, |loss difference| and the input gradient's
max |difference| over its max |value|).
  python docs/runs/scripts/2026-11-26_loss_head.py [--unsloth]"""
import sys

import torch

import cuda_timing as timing  # beside this script

SHAPES = {"mistral-7b-v0.3": (4096, 32768), "llama-3.1-8b": (4096, 128256), "qwen2.5-7b": (3584, 152064),
          "qwen3-8b": (4096, 151936), "gemma-2-9b": (3584, 256000)}
ROWS = (4096, 8192)  # b4 x 1024 (b8 x 512), b8 x 1024


def liger(c):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return lambda x, w, y: liger_fused_linear_cross_entropy(x, w, y, chunk_mem_const=c)


def plain(x, w, y):
    return torch.nn.functional.cross_entropy((x @ w.t()).float(), y)


def unsloth_ce(x, w, y):
    from unsloth_zoo.fused_losses.cross_entropy_loss import unsloth_fused_ce_loss

    return unsloth_fused_ce_loss(trainer=None, hidden_states=x[None], lm_head_weight=w, lm_head_bias=None,
                                 labels=y[None], shift_labels=False)


def measure(fn, x, w, y, reference):
    def step():
        x.grad = None
        loss = fn(x, w, y)
        loss.backward()
        return loss

    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = step()
    extra = (torch.cuda.max_memory_allocated() - before) / 2**20
    ref_loss, ref_grad = reference
    loss_err = abs(loss.item() - ref_loss)
    grad_err = ((x.grad.float() - ref_grad).abs().max() / ref_grad.abs().max()).item()
    return timing.ms(step, n=10, warmup=3), extra, loss_err, grad_err


def reference(x, w, y):
    x.grad = None
    loss = plain(x, w, y)
    loss.backward()
    return loss.item(), x.grad.float()


def main():
    if "--unsloth" in sys.argv:
        import unsloth  # noqa: F401  (first, as in backend=unsloth: it patches what it imports)
    impls = {"unsloth": unsloth_ce} if "--unsloth" in sys.argv else \
        {**{f"liger {c}": liger(c) for c in (1, 2, 4, 8, 16, 32)}, "torch": plain}
    print("model,hidden,vocab,rows,impl,ms,extra_mib,loss_err,grad_err")
    for model, (hidden, vocab) in SHAPES.items():
        torch.manual_seed(0)
        w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5
        for rows in ROWS:
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            y = torch.randint(0, vocab, (rows,), device="cuda")
            ref = reference(x, w, y)
            for name, fn in impls.items():
                try:
                    ms, extra, loss_err, grad_err = measure(fn, x, w, y, ref)
                    print(f"{model},{hidden},{vocab},{rows},{name},{ms:.2f},{extra:.0f},{loss_err:.2e},"
                          f"{grad_err:.2e}", flush=True)
                except Exception as e:  # noqa: BLE001  (one failing implementation leaves the others)
                    print(f"{model},{hidden},{vocab},{rows},{name},error,{type(e).__name__}: {e}"[:300], flush=True)
            del x, ref
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
