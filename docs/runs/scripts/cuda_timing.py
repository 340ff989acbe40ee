"""The GPU timing the measuring scripts beside this share: mean ms of fn over n calls after `warmup`
calls, from CUDA events around the n calls (one device sync at the end)."""
import torch


def ms(fn, n=20, warmup=3):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n
