"""Compare a resumed run with two uninterrupted ones (docs/runs/scripts/2026-11-24_gpu_resume.sh):
    python docs/runs/scripts/compare_resume.py REF1 REF2 RESUMED
per-step losses (max |difference| over all steps, and over the steps after the resume), the final
checkpoint's optimizer state tensor by tensor, and the LoRA adapter. The noise floor is REF1 vs REF2."""

import json
import sys
from pathlib import Path

import torch


def losses(run: Path) -> dict[int, float]:
    return {s["step"]: s["loss"] for s in map(json.loads, (run / "steps.jsonl").read_text().splitlines())}


def tensors(obj, prefix=""):
    """Every tensor in a nested state dict, by path."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


def max_diff(a: dict, b: dict) -> tuple[float, int]:
    keys = sorted(set(a) & set(b))
    return max(abs(a[k] - b[k]) for k in keys), len(keys)


def state_diff(a: Path, b: Path) -> tuple[float, int, dict]:
    sa, sb = (dict(tensors(torch.load(p, map_location="cpu", weights_only=False))) for p in (a, b))
    dtypes = {}
    worst = 0.0
    for k, t in sa.items():
        dtypes[str(t.dtype)] = dtypes.get(str(t.dtype), 0) + 1
        worst = max(worst, (t.double() - sb[k].double()).abs().max().item() if t.numel() else 0.0)
    return worst, len(sa), dtypes


ref1, ref2, resumed = map(Path, sys.argv[1:4])
meta = json.loads((resumed / "metrics.json").read_text())
after = meta.get("resumed_from_step") or 0
l1, l2, lr = losses(ref1), losses(ref2), losses(resumed)
print(f"resumed run: status {meta['status']}, resumed_from_step {after}, {len(lr)} step records "
      f"(steps {min(lr)}-{max(lr)}, one history)")
print(f"loss ref1 {l1[1]:.4f} -> {l1[max(l1)]:.4f}; resumed {lr[1]:.4f} -> {lr[max(lr)]:.4f}")
for name, other in (("ref2 (noise floor)", l2), ("resumed", lr)):
    d, n = max_diff(l1, other)
    tail = max(abs(l1[s] - other[s]) for s in l1 if s > after and s in other)
    print(f"max |loss ref1 - {name}| over {n} steps: {d:.2e}; over steps > {after}: {tail:.2e}")
last = max(int(p.name.split("-")[1]) for p in (ref1 / "checkpoints").glob("checkpoint-*"))
for part in ("optimizer.pt", "adapter_model.safetensors"):
    for name, other in (("ref2", ref2), ("resumed", resumed)):
        a, b = ref1 / "checkpoints" / f"checkpoint-{last}" / part, other / "checkpoints" / f"checkpoint-{last}" / part
        if part.endswith(".safetensors"):
            from safetensors.torch import load_file
            sa, sb = load_file(a), load_file(b)
            worst = max((sa[k].double() - sb[k].double()).abs().max().item() for k in sa)
            print(f"adapter at step {last}: max |ref1 - {name}| = {worst:.2e} over {len(sa)} tensors")
        else:
            worst, n, dtypes = state_diff(a, b)
            print(f"optimizer state at step {last}: max |ref1 - {name}| = {worst:.2e} over {n} tensors {dtypes}")
