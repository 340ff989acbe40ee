"""Where the GPU memory of one training step goes, layer by layer, for a few layer plans (recomputed /
offloaded / kept), Mistral-7B nf4 under backend=fast on the GPU at hand:

    python docs/runs/scripts/2026-11-24_offload_memory.py [seq_len batch] [recompute,offload ...]

Prints, per plan: memory allocated after each decoder layer's forward (MiB), the peak of the forward
and of the whole step, the step time (synchronised, third step), what went to host memory, how many
tensors came back late; and the saved tensors of one offloaded layer by size.
"""

import sys
import time

import torch
from omegaconf import OmegaConf

from lorabench.run import backends
from lorabench.fast import offload
from lorabench.core.config import Config  # noqa: F401  (registers the schemas)
from lorabench.run.loop import build_trainable_model

sys.path.insert(0, "tests")
from conftest import compose_cfg  # noqa: E402

MIB = 2**20
seq, batch = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (2048, 6)
plans = [tuple(int(x) for x in p.split(",")) for p in sys.argv[3:]] or [(20, 0), (12, 8), (0, 20)]
device = torch.device("cuda", 0)
sizes = []  # (bytes, shape, dtype) of layer 1's saved tensors, first plan with offloading
for recompute, off in plans:
    c = OmegaConf.to_object(compose_cfg([
        "+experiment=seed_optimum", "backend=fast", "model=mistral-7b-v0.3", f"seq_len={seq}", f"batch={batch}",
        "train.gradient_checkpointing=true", f"train.checkpoint_fraction={recompute / 32}",
        f"train.offload_fraction={off / 32}"]))
    with backends.module_patches(c):
        model, _, _ = build_trainable_model(c, device)
        model.train()
        layers = backends.decoder_layers(model)
        after = [0] * len(layers)
        for i, layer in enumerate(layers):
            layer.register_forward_hook(lambda m, a, o, i=i: after.__setitem__(i, torch.cuda.memory_allocated(device)))
        o = model.lorabench_offloader
        if o is not None and not sizes:
            pack = o.pack
            def spy(layer, t, pack=pack):
                if layer == offload.layer_plan(32, recompute, off).index("offload"):
                    sizes.append((t.numel() * t.element_size(), tuple(t.shape), str(t.dtype), t.is_contiguous()))
                return pack(layer, t)
            o.pack = spy
        ids = torch.randint(0, 32000, (batch, seq), device=device)
        for step in range(3):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            with torch.autocast("cuda", torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            fwd_peak = torch.cuda.max_memory_allocated(device)
            end_fwd = torch.cuda.memory_allocated(device)
            loss.backward()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
        print(f"plan r{recompute} o{off} k{32 - recompute - off}: {''.join(h[0] for h in offload.layer_plan(32, recompute, off))}")
        print("  allocated after each layer's forward, MiB:", " ".join(f"{a / MIB:.0f}" for a in after))
        print(f"  end of forward {end_fwd / MIB:.0f} MiB, forward peak {fwd_peak / MIB:.0f}, step peak "
              f"{torch.cuda.max_memory_allocated(device) / MIB:.0f}, reserved {torch.cuda.max_memory_reserved(device) / MIB:.0f};"
              f" step {dt * 1e3:.0f} ms ({batch * seq / dt:,.0f} tok/s)")
        if o is not None:
            print(f"  host: {o.peak_bytes / MIB:.0f} MiB per step, late tensors {o.late}")
        del model, loss
        torch.cuda.empty_cache()
print("saved tensors of the lowest offloaded layer (bytes, shape, dtype, contiguous):")
for s in sorted(sizes, reverse=True):
    print("  ", s)
