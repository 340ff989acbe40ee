"""The GPU timing the measuring scripts beside this share: mean ms of fn over n calls after `warmup`
calls, from CUDA events around the n calls (one device sync at the end); or the median of n calls each timed
by its own events (one sync per call: a slow call shows as one)."""
import statistics

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


def median_ms(fn, n=30, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
