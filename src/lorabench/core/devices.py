"""Where a cell runs: its device, the GPU spec that prices it (conf/gpu), the memory budget of an
emulated GPU, and this node's index in a multi-node cell."""

from __future__ import annotations

import os
import re
from dataclasses import asdict

import torch
from omegaconf import OmegaConf

from lorabench.core.config import CONF_DIR, Device, GpuConfig
from lorabench.core.results import CellResult

# The profiler range of the copies between host and device that run beside the compute (lorabench.fast.offload):
# left out of a step's partition (lorabench.measure.profile); a step that waits for one shows it as idle.
COPY_RANGE = "lorabench/offload_copy"


def _indexed_cpu(storage, location: str):
    """torch.load's restore of a storage tagged "cpu:<n>": it is in host memory already."""
    return storage if re.fullmatch(r"cpu:\d+", location) else None


# Under DDP on CPU processes (gloo) accelerate names each rank's device cpu:<local rank>, and the Trainer
# loads the optimizer's state of a checkpoint with map_location=args.device under several processes. torch.load
# knows the location "cpu" only, so every resume of a multi-process CPU cell failed ("don't know how to restore
# data location of torch.storage.UntypedStorage (tagged with cpu:0)"). An indexed CPU is the CPU.
torch.serialization.register_package(30, lambda obj: None, _indexed_cpu)


def resolve_device(device: Device) -> torch.device:
    want = device.value
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but torch sees no CUDA device "
                           f"(torch {torch.__version__}); use device=cpu or auto")
    if want == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def visible_gpu_gib() -> float | None:
    """The total memory (GiB) of the first GPU CUDA_VISIBLE_DEVICES names (index or UUID; GPU 0 without
    it), read through NVML, so without a CUDA context in this process; None without NVML or a GPU. NVML
    counts GPUs in PCI order, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: the same GPU on a
    node of one kind; a first cell's own figure replaces this one (lorabench.sweep.search)."""
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no package, no driver: NVMLError or ImportError
        return None
    try:
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        handle = pynvml.nvmlDeviceGetHandleByUUID(first) if first.startswith(("GPU-", "MIG-")) \
            else pynvml.nvmlDeviceGetHandleByIndex(int(first))
        return pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
    except (pynvml.NVMLError, ValueError):  # no such GPU, or CUDA_VISIBLE_DEVICES empty or hiding them all
        return None
    finally:
        pynvml.nvmlShutdown()


def resolve_gpu(gpu: GpuConfig, device_name: str) -> GpuConfig:
    """gpu=auto: the conf/gpu option whose `match` fits this device name, with any field set on the
    command line (e.g. gpu.price_per_hour=2.49) on top. A device not in the table keeps its own name
    and no price or peak: cost and MFU are then left out, never guessed. Another option than auto
    is returned as given."""
    if gpu.name != "auto":
        return gpu
    spec = {"name": device_name}
    for path in sorted((CONF_DIR / "gpu").glob("*.yaml")):
        option = OmegaConf.load(path)
        option.pop("defaults", None)
        if any(re.search(pattern, device_name) for pattern in option.get("match", [])):
            spec = OmegaConf.to_container(option)
            break
    given = {k: v for k, v in asdict(gpu).items() if v is not None and k not in ("name", "match")}
    return GpuConfig(**{**spec, **given})


def setup_device(want: Device, gpu: GpuConfig, result: CellResult) -> tuple[torch.device, GpuConfig]:
    """The device this cell runs on, the GPU spec that prices it (and gives its peak FLOP/s), and,
    when the gpu option names another GPU than this one, that GPU's memory as this process's budget."""
    device = resolve_device(want)
    result.device = str(device)
    here = device_name(device)
    if gpu.name == "auto":
        spec, target = resolve_gpu(gpu, here), None
    elif any(re.search(p, here) for p in gpu.match):
        spec, target = gpu, None  # the option names this GPU (with any fields set on the command line)
    else:  # another GPU: emulated here (target), priced as this one unless asked otherwise
        real = resolve_gpu(GpuConfig(name="auto", pricing=gpu.pricing), here)
        spec, target = (gpu if gpu.price_of_target else real), gpu
    result.gpu = {k: getattr(spec, k) for k in ("name", "price_per_hour", "spot_price_per_hour", "peak_bf16_tflops")}
    result.gpu.update(pricing=spec.pricing.value, device_name=here)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # an OOM's peak then belongs to this cell alone
        if target is not None and gpu.emulate_memory and gpu.memory_gib:
            total = torch.cuda.get_device_properties(device).total_memory
            if gpu.memory_gib * 2**30 > total:
                raise ValueError(f"gpu={gpu.name}: its memory_gib={gpu.memory_gib} is more than this device has "
                                 f"({here}, {total / 2**30:.1f} GiB); the budget cannot be emulated here")
            # PyTorch's caching allocator refuses to reserve more than this fraction of the device.
            torch.cuda.set_per_process_memory_fraction(gpu.memory_gib * 2**30 / total, device)
            result.gpu.update(emulated=gpu.name, budget_gib=gpu.memory_gib)
    elif target is not None:
        result.gpu["emulated"] = None  # a CPU has no device memory to cap: nothing emulated
    return device, spec


def node_rank() -> int:
    """This node's index in a multi-node cell (train.nnodes > 1)."""
    for var in ("LORABENCH_NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    raise ValueError("train.nnodes > 1 needs this node's index: set LORABENCH_NODE_RANK (a Kubernetes Indexed "
                     "Job sets JOB_COMPLETION_INDEX, SLURM sets SLURM_NODEID)")
