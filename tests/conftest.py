import copy
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf

import lorabench.core.config  # noqa: F401  (registers the schemas)

REPO = Path(__file__).resolve().parents[1]
# Tests never reach a hub, in this process or in the train.py subprocesses.
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[var] = "1"
# Tokenised-data cache of the whole test session in a temp dir (subprocesses inherit it).
os.environ.setdefault("LORABENCH_CACHE", tempfile.mkdtemp(prefix="lorabench-cache-"))
# Checkpoints converted from a GGUF file (model=smollm2-135m) where a user's are: a conversion is a function of its file
# alone (lorabench.models.gguf names its folder by the file), and takes about a minute, not to be paid every session.
os.environ.setdefault("LORABENCH_MODELS", str(Path("~/.cache/lorabench/models").expanduser()))
# Under pytest-xdist (`make test` runs 2 workers on CI's 2 cores), one thread per worker and per
# subprocess it starts: two workers with two intra-op threads each only contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
CONF = REPO / "conf"


def pytest_collection_finish(session):
    """Every test module is imported by now: the objects they made (torch, transformers, PEFT and their
    registries) are kept out of the garbage collector's full passes. HF's Trainer collects at the start of every
    cell's training (accelerate's free_memory), and in a test worker that holds every module a full pass costs
    ~0.3 s a cell; a process that runs one cell, as train.py does, holds a fraction of those objects."""
    gc.freeze()


# A few steps are enough to exercise every part of a cell; the default task test runs the full default.
FAST = ["train.max_steps=6", "train.untimed_steps=2", "data.max_samples=64"]
from lorabench.models.families import TINY_SHAPE  # noqa: E402  (the tiny checkpoints' shape, one home)


def breadth(values, quick):
    """`values` for pytest.mark.parametrize, those not in `quick` in the slow tier. A test that repeats one
    check over every option, family or run dir runs in `make test` on `quick`, a case of each kind it tells
    apart; `make test-all` and CI run every case."""
    values = list(values)
    missing = [q for q in quick if q not in values]
    assert not missing, f"quick cases not among the values: {missing}"
    return [v if v in quick else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for v in values]


def tiny_config(model_type: str, **shape):
    """The transformers config of `model_type`'s tiny checkpoint: TINY_SHAPE, its family's keys, then `shape`."""
    from transformers import AutoConfig

    from lorabench.models import FAMILIES

    return AutoConfig.for_model(model_type, **{**TINY_SHAPE, **FAMILIES[model_type].tiny, **shape})


def compose_cfg(overrides=(), config_name="train", return_hydra_config=False):
    """Hydra's compose of conf/ (a copy: a test may change what it gets). A compose takes 0.25-0.45 s on 2 cores,
    nearly all of it choosing and merging the groups' configs; a test worker asks for ~280, most of them the same
    groups with other values. So each set of group choices is composed once, and the overrides of single values
    are applied to a copy of it by the function Hydra's compose applies them with, in their order, after the
    groups, as it does (the same values, the same errors)."""
    return copy.deepcopy(_composed(tuple(overrides), config_name, return_hydra_config))


@functools.lru_cache(maxsize=None)
def _composed(overrides, config_name, return_hydra_config):
    values = [] if return_hydra_config else value_overrides(overrides)
    if values:
        applied = {v.input_line for v in values}
        groups = tuple(o for o in overrides if o not in applied)
        cfg = copy.deepcopy(_composed(groups, config_name, False))
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides),
                       return_hydra_config=return_hydra_config)


GROUPS = {p.name for p in CONF.iterdir() if p.is_dir()} | {
    k for k, v in ConfigStore.instance().repo.items() if isinstance(v, dict)}


def value_overrides(overrides) -> list:
    """The overrides Hydra applies to the composed config rather than to its choice of group configs (its
    defaults list's config_overrides): a key that is no group, no package, sweep, deletion or hydra key. Any
    other override, or one that does not parse, leaves them all to Hydra's compose."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException:
        return []
    values = [o for o in parsed if o.key_or_group not in GROUPS]
    plain = all(o.package is None and not o.is_sweep_override() and not o.is_delete() and not o.is_hydra_override()
                for o in values)
    return values if plain and len({o.input_line for o in parsed}) == len(parsed) else []


def run_in_process(overrides, run_dir, **ctx):
    """One cell through lorabench.train.run_cell in this process (no interpreter start-up), with the
    context the entrypoint would pass; returns its CellResult."""
    from lorabench.core.results import RunContext
    from lorabench.train import run_cell

    ctx = RunContext(run_dir=Path(run_dir), name=",".join(overrides) or "defaults", **ctx)
    return run_cell(compose_cfg(overrides), ctx)


def run_cli(script, args, cwd=REPO, check=True, env=None, fresh=False):
    """Run train.py / bench.py as a user would: `python <script> <args>`, its own process, exit code
    and output. By default the process is forked from this one (os.fork), which has torch,
    transformers and PEFT imported already: 8 s of imports saved per command on this machine's
    CPUs. `fresh=True` starts a new interpreter, for what happens at import (a library's warning);
    so does a process that has used CUDA (a forked child cannot)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    argv = [str(REPO / script), *args]
    if fresh:
        proc = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    else:
        proc = run_forked(argv, cwd, env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


class Forked:
    """argv[0] run as __main__ in a forked child, as `python argv...` would run it (a Popen-like
    handle: pid, poll, wait, returncode): the exit code is SystemExit's, 1 for an uncaught exception,
    minus the signal's number for a killed child; stdout and stderr are kept in files."""

    def __init__(self, argv, cwd=REPO, env=None):
        self.argv, self.returncode, self._popen = list(argv), None, None
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        # A new interpreter where a fork would hang or break: CUDA does not survive a fork, nor do
        # OpenMP's worker threads once a parent has used them (outside xdist, torch runs 2 intra-op
        # threads and the child stopped in its first matmul).
        if torch.cuda.is_initialized() or torch.get_num_threads() > 1:
            self._popen = subprocess.Popen([sys.executable, *self.argv], cwd=cwd, env={**os.environ, **(env or {})},
                                           stdout=self._out, stderr=self._err)
            self.pid = self._popen.pid
            return
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            self._child(cwd, {**os.environ, **(env or {})})

    def _child(self, cwd, env):
        import runpy
        import traceback

        code = 1
        try:
            os.dup2(self._out.fileno(), 1)
            os.dup2(self._err.fileno(), 2)
            sys.stdout, sys.stderr = open(1, "w", buffering=1, closefd=False), open(2, "w", buffering=1, closefd=False)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = list(self.argv)
            from hydra.core.global_hydra import GlobalHydra

            GlobalHydra.instance().clear()
            runpy.run_path(self.argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def poll(self):
        if self._popen is not None:
            self.returncode = self._popen.poll()
        elif self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=600):
        import time

        deadline = time.time() + timeout
        while self.poll() is None:
            if time.time() > deadline:
                os.kill(self.pid, 9)
                raise subprocess.TimeoutExpired(self.argv, timeout)
            time.sleep(0.05)
        return self.returncode

    def output(self) -> tuple[str, str]:
        return tuple(f.seek(0) or f.read().decode(errors="replace") for f in (self._out, self._err))


def run_forked(argv, cwd, env, timeout=600):
    child = Forked(argv, cwd, env)
    code = child.wait(timeout)
    return subprocess.CompletedProcess(argv, code, *child.output())


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def read_steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "steps.jsonl").read_text().splitlines()]


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Numeric tolerances follow from the arithmetic compared, never from one machine's rounding
# (tests/README.md): a dtype's epsilon (one rounding, relative) times the roundings that can differ.
EPS32 = torch.finfo(torch.float32).eps  # 2^-23 = 1.2e-7
EPS64 = torch.finfo(torch.float64).eps  # 2^-52 = 2.2e-16
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 2^-7 = 7.8e-3 (bf16 keeps 8 significant bits)
# Mistral as transformers runs it rounds to fp32 on purpose even with float64 weights: in each of the
# tiny model's 2 layers its two RMSNorms (hidden_states.to(torch.float32)) and the attention's softmax
# (eager: dtype=torch.float32), then the final norm and the logits for the loss (ForCausalLMLoss:
# logits.float()): 3 x 2 + 2 = 8 fp32 roundings on the longest forward path, and as many again on
# the backward's way back to a LoRA gradient.
FP32_CASTS = 2 * (3 * 2 + 2)
# Two paths that compute the same function, compared in float64 (the `float64` fixture): their
# different summation orders cost ~1e-16 per operation (1e-13 after 1,000 of them), so what can
# differ is at most one fp32 rounding at each of those casts: 16 x 1.2e-7 = 1.9e-6, relative. (An
# error of the formula, a missing term or scale, is of the order of the term itself.)
SAME_MATH = FP32_CASTS * EPS32
# bf16 on a GPU (its tests), where both paths compute in bf16 and round at different points: the loss
# (a mean of per-token losses near ln(32768) = 10.4, from bf16 logits) within one bf16 step per side,
# 2 x EPS_BF16 = 1.6%; a LoRA gradient (bf16 products summed over the tokens, through every layer
# back) within 4 steps of its norm, 3.1%. A wrong formula is off by the order of the term itself.
BF16_LOSS = 2 * EPS_BF16
BF16_GRADS = 4 * EPS_BF16


@pytest.fixture
def float64(monkeypatch):
    """precision=fp32 builds its models in float64 (weights, activations and LoRA gradients): for
    comparisons of two paths that must compute the same function, where fp32's own rounding
    (~1e-7 per operation, its summation order chosen by the CPU's BLAS kernels and thread count)
    would otherwise be all that the comparison sees. Tolerance: SAME_MATH."""
    from lorabench.builders import modeling
    from lorabench.core.config import Precision

    monkeypatch.setitem(modeling.WEIGHT_DTYPE, Precision.fp32, torch.float64)



def spy(monkeypatch, owner, name: str) -> list:
    """Let `owner.name` run as before, recording each call in the list given back: what it returned, or
    None while it runs or when it never returns (a layer's recompute that checkpointing stops early)."""
    returned, real = [], getattr(owner, name)

    def recorded(*args, **kwargs):
        i = len(returned)
        returned.append(None)
        returned[i] = real(*args, **kwargs)
        return returned[i]

    monkeypatch.setattr(owner, name, recorded)
    return returned


# ---------------------------------------------------------------------------- LoRA gradients of one batch
def lora_grads(overrides, device, steps_batch=4):
    """LoRA gradients of one batch of real chat data (tiny model), the way a cell builds the model."""
    c = OmegaConf.to_object(compose_cfg(["seq_len=64", f"batch={steps_batch}", *overrides]))
    torch.manual_seed(0)
    from lorabench.builders import data, modeling
    from lorabench.fast import parts
    from lorabench.run import backends
    from lorabench.run.loop import build_trainable_model

    with backends.module_patches(c):
        tok = modeling.build_tokenizer(c.model)
        ds, _ = data.build_dataset(c, tok)
        collate = data.build_collator(c, tok, segments=parts.varlen_runs(c, device))  # as lorabench.run.loop's
        batch = collate([ds[i] for i in range(steps_batch)])
        batch.pop(data.REAL_TOKENS, None)
        model, _, (checkpointed, _) = build_trainable_model(c, device)
        model.train()
        # PEFT starts lora_B at zero, which leaves lora_A without a gradient: give B seeded values
        # so that both halves of every adapter are compared.
        g = torch.Generator().manual_seed(1)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.data.copy_(torch.randn(p.shape, generator=g) * 0.05)
        dtype = modeling.WEIGHT_DTYPE[c.precision.name]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype in (torch.bfloat16, torch.float16)):
            loss = model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}).loss
        loss.backward()
    grads = {n: p.grad.double().cpu() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads, checkpointed


def assert_grads_close(a, b, rtol):
    assert a.keys() == b.keys() and a
    for n in a:
        # relative to the tensor's norm: elementwise rtol would fail on entries near zero
        err = (a[n] - b[n]).norm() / b[n].norm()
        assert err < rtol, (n, err.item())


def _mask(x, p):
    return torch.rand(x.shape, device=x.device) >= p


class _SameMaskDropout(torch.nn.Dropout):
    # (every nn.Dropout built while the fixture is on is one: p = 0 ones, such as Phi-3's residual
    # dropout, draw nothing, as the fused path, which has none of them, draws nothing)
    def forward(self, x):
        return x * _mask(x, self.p) / (1 - self.p) if self.training and self.p else x


@pytest.fixture
def same_masks(monkeypatch):
    """PEFT's dropout modules and the Function's dropout draw one mask source."""
    import peft.tuners.lora.layer as lora_layer

    from lorabench.fast import fused

    def dropout(x, p, seeded, slot=None):
        m = _mask(x, p)
        return x * m / (1 - p), m

    monkeypatch.setattr(fused, "_dropout", dropout)
    monkeypatch.setattr(lora_layer.nn, "Dropout", _SameMaskDropout)  # PEFT builds nn.Dropout(p) per adapter
