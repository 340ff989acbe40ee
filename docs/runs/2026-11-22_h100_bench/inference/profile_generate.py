import sys, time, torch
sys.path.insert(0, 'tests')
from conftest import compose_cfg
from omegaconf import OmegaConf
from lorabench import modeling
from torch.profiler import profile, ProfilerActivity
c = OmegaConf.to_object(compose_cfg(["model=mistral-7b-v0.3", "precision=bf16", "suite=inference"], config_name="bench"))
dev = torch.device("cuda", 0)
model, _ = modeling.build_model(c, dev); model.eval(); model.config.use_cache = True
def gen(b, n, **kw):
    ids = torch.randint(1000, 32768, (b, 128), device=dev)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **kw)
    torch.cuda.synchronize(); return time.perf_counter() - t
for b in (1, 8, 32):
    gen(b, 4)
    print(f"## b{b} dynamic: {1e3*(gen(b, 33) - gen(b, 1))/32:.1f} ms/token", flush=True)
    try:
        gen(b, 4, cache_implementation="static")
        print(f"## b{b} static: {1e3*(gen(b, 33, cache_implementation='static') - gen(b, 1, cache_implementation='static'))/32:.1f} ms/token", flush=True)
    except Exception as e: print("## static failed", type(e).__name__, str(e)[:200])
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    gen(32, 9)
print("## " + prof.key_averages().table(sort_by="cuda_time_total", row_limit=12).replace("\n", "\n## "))
print("## " + prof.key_averages().table(sort_by="cpu_time_total", row_limit=10).replace("\n", "\n## "))
