"""What is alive at a cell's peak of allocated GPU memory, grouped by the line that allocated it.

    python docs/runs/scripts/memory_peak.py <out dir> <train.py arguments...>     # on a GPU

Runs train.py in this process under PyTorch's allocator history (torch.cuda.memory._record_memory_history),
then replays the trace: the live bytes after each event, the largest after the last reset of the peak
statistics (lorabench.measure.meter resets them where the timed window starts, so this is the peak that metrics.json
records as mem/peak_allocated_gib), and the tensors alive at that moment grouped by the first frame outside
torch's own modules (torch.optim and torch.utils.checkpoint count as callers). Writes <out dir>/peak.md.
A sweep of one cell is meant: the replay covers the whole process.
"""

import runpy
import sys
from collections import defaultdict
from pathlib import Path

import torch

GIB = 2**30
OWN = ("torch/", "<frozen", "threading.py", "contextlib.py")
CALLERS = ("torch/optim/", "torch/utils/checkpoint.py")
resets: list[int] = []  # the trace's length at each reset of the peak statistics


def trace_len() -> int:
    return sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])


def importable(path: str) -> str:
    """A file's path from the sys.path entry it is imported through (lorabench/fast/fused.py, bitsandbytes/...): the
    same on every machine."""
    roots = sorted((r.rstrip("/") + "/" for r in sys.path if r), key=len, reverse=True)
    return next((path[len(r):] for r in roots if path.startswith(r)), path)


def label(frames: list[dict]) -> str:
    """The first frame, innermost first, that is not torch's own machinery."""
    for f in frames:
        name = f["filename"]
        if not name.endswith(".py"):  # C++ frames (torch::unwind, at::...), when PyTorch records them
            continue
        if not any(o in name for o in OWN) or any(c in name for c in CALLERS):
            return f"{importable(name)}:{f['line']} {f['name']}"
    return "(torch internals)"


def replay(trace: list[dict], start: int) -> tuple[int, int]:
    """(index, bytes) of the largest live total after event `start`."""
    live, total, best = {}, 0, (start, -1)
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["action"] == "free_completed":
            total -= live.pop(e["addr"], 0)
        if i >= start and total > best[1]:
            best = (i, total)
    return best


def alive_at(trace: list[dict], index: int) -> dict[int, dict]:
    live = {}
    for e in trace[:index + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return live


def sizes(events: list[dict]) -> str:
    """The blocks of one group by size, largest first: '72.0 x 32, 16.0 x 2'."""
    count: dict[int, int] = defaultdict(int)
    for e in events:
        count[e["size"]] += 1
    return ", ".join(f"{b / 2**20:.1f} x {n}" for b, n in sorted(count.items(), reverse=True)[:4])


def stack(frames: list[dict], n: int = 14) -> str:
    """An allocation's Python frames, innermost first (C++ frames left out), as an indented block."""
    py = [f"{importable(f['filename'])}:{f['line']} {f['name']}" for f in frames if f["filename"].endswith(".py")]
    return "\n".join("    " + line for line in py[:n])


def main(out: Path, args: list[str]) -> None:
    reset = torch.cuda.reset_peak_memory_stats

    def recorded_reset(device=None):
        resets.append(trace_len())
        reset(device)

    torch.cuda.reset_peak_memory_stats = recorded_reset
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=4_000_000)
    sys.argv = ["train.py", *args]
    try:
        runpy.run_path("train.py", run_name="__main__")
    except SystemExit:
        pass
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    start = resets[-1] if resets else 0
    index, peak = replay(trace, start)
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in alive_at(trace, index).values():
        groups[label(e["frames"])].append(e)
    lines = [f"# Live at the peak of allocated memory: {peak / GIB:.2f} GiB (event {index:,} of {len(trace):,}, "
             f"peak statistics last reset at event {start:,})", "", f"train.py {' '.join(args)}", "",
             "| GiB | allocated at | blocks (MiB x count) |", "|---|---|---|"]
    big = sorted(((k, es) for k, es in groups.items() if sum(e["size"] for e in es) >= 2**24),
                 key=lambda kv: -sum(e["size"] for e in kv[1]))
    lines += [f"| {sum(e['size'] for e in es) / GIB:.3f} | {k} | {sizes(es)} |" for k, es in big]
    # What the peak's own allocation was (where the step was), and the stack of each large group's largest block.
    lines += ["", "The allocation that reached the peak:", "", stack(trace[index]["frames"])]
    for k, es in big:
        if sum(e["size"] for e in es) >= GIB / 2:
            lines += ["", f"{k}: its largest block's stack", "", stack(max(es, key=lambda e: e["size"])["frames"])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "peak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
