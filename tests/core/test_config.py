"""Every option of every group composes into the typed schema; bad values fail with Hydra's message."""

import pytest
import torch
from conftest import CONF, breadth, compose_cfg
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from lorabench.core.config import Config, Precision
from lorabench.run import checks

# experiment and diag options are deltas on other configs: their own tests below compose them.
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("experiment", "diag"))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]
EXPERIMENTS = sorted(f.stem for f in (CONF / "experiment").glob("*.yaml"))


# The tests' compose_cfg applies the overrides of single values to its cached compose of the groups: each such
# set, with groups or without, an added key, a value Hydra parses (a list, NaN, an empty string), a wrong type and
# an unknown key, gives what Hydra's own compose gives, config or error.
SAME_AS_HYDRA = [["batch=4", "seq_len=16"], ["data=synthetic", "lora.r=4", "batch=2"],
                 ["lora.target_modules=[q_proj,v_proj]", "+experiment=tune", "gpu=a10"],
                 ["model.path=", "model=qwen3.5-9b"], ["optimizer.lr=nan"], ["+train.extra=3"], ["batch=four"],
                 ["train.max_step=10"]]


@pytest.mark.parametrize("overrides", SAME_AS_HYDRA, ids=lambda o: ",".join(o))
def test_the_tests_compose_gives_what_hydra_s_gives(overrides):
    from hydra import compose, initialize_config_dir

    def outcome(fn):
        try:
            return OmegaConf.to_yaml(fn())
        except Exception as e:  # the error's kind and message, and its cause's
            return f"{type(e).__name__}: {e} / {e.__cause__!r}"

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        hydra = outcome(lambda: compose(config_name="train", overrides=overrides))
    assert outcome(lambda: compose_cfg(overrides)) == hydra


def test_groups_present():
    assert {"model", "precision", "lora", "optimizer", "data", "gpu", "logger"} <= set(GROUPS)
    assert {"nf4", "int8", "bf16", "fp16", "fp32"} == {o for g, o in OPTIONS if g == "precision"}
    assert {"paged_adamw_8bit", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "adafactor"} == {
        o for g, o in OPTIONS if g == "optimizer"}


# Options that need one more value to be complete.
NEEDS = {("data", "jsonl"): ["data.path=train.jsonl"], ("data", "hf"): ["data.path=my_dataset_dir"]}


# make test: each group's first option (a compose takes ~0.25 s, 61 of them 15 s)
QUICK_OPTIONS = [next(o for o in OPTIONS if o[0] == g) for g in GROUPS if any(o[0] == g for o in OPTIONS)]


@pytest.mark.parametrize("group,option", breadth(OPTIONS, QUICK_OPTIONS), ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_into_schema(group, option):
    cfg = compose_cfg([f"{group}={option}", *NEEDS.get((group, option), [])])
    obj = OmegaConf.to_object(cfg)  # builds the dataclasses and runs their range checks
    assert isinstance(obj, Config)
    assert OmegaConf.get_type(cfg, group) is type(getattr(obj, group))


TIME_TO_LOSS = ("time_to_loss", "time_to_loss_cpu")  # the quality recipe (docs/quality.md), not the seed's


@pytest.mark.parametrize("name", breadth([e for e in EXPERIMENTS if e not in TIME_TO_LOSS],
                                          ["seed_optimum", "tune", "max_context", "fsdp_scaling", "trl_l4_check"]))
def test_every_experiment_composes(name):
    obj = OmegaConf.to_object(compose_cfg([f"+experiment={name}"]))
    # every experiment is the seed's recipe; fsdp_scaling on the 70B model it is for, with an optimizer that
    # updates FSDP's sharded adapters (bitsandbytes' do not: lorabench.run.checks); fms_a100_check and trl_l4_check
    # with the published runs' models and optimizers; max_context on a model whose window reaches 131,072 tokens
    model, optimizer = {"fsdp_scaling": ("llama-3.3-70b", "adamw_torch_fused"),
                        "max_context": ("llama-3.1-8b", "paged_adamw_8bit"),  # a window of 131,072 tokens
                        "fms_a100_check": ("mistral-7b-v0.3", "adamw_torch"),
                        "trl_l4_check": ("llama-3.1-8b", "adamw_torch_fused")}.get(
        name, ("mistral-7b-v0.3", "paged_adamw_8bit"))
    assert obj.model.name == model and obj.precision.name is Precision.nf4
    assert obj.optimizer.name.value == optimizer and obj.train.gradient_checkpointing
    if name == "trl_l4_check":  # TRL 0.9.6 casts the embedding and head back to bf16 (docs/runs/trl_l4)
        assert obj.backend.name.value == "hf" and not obj.backend.upcast_fp32
    checks.check_backend(OmegaConf.to_object(compose_cfg([f"+experiment={name}", "train.nproc=2"])))  # on 2 GPUs


@pytest.mark.parametrize("name", TIME_TO_LOSS)
def test_the_time_to_loss_recipe_is_mlperfs_lora_form(name):
    """LoRA r16 (alpha 32, dropout 0.1) on q/k/v/o, packed rows, evaluations and a target, over quality.repeats
    seeds: the sweep's params give train.seed=range(0, quality.repeats), the command line's repeats too."""
    from lorabench.sweep.grid import expand

    cfg = compose_cfg([f"+experiment={name}", "quality.repeats=3"], return_hydra_config=True)
    obj = OmegaConf.to_object(compose_cfg([f"+experiment={name}"]))
    assert obj.model.name == "smollm2-135m" and obj.data.packing and obj.quality.on
    assert (obj.lora.r, obj.lora.alpha, obj.lora.dropout) == (16, 32, 0.1)
    assert obj.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert obj.quality.target_relative == 1.01 and obj.precision.name is (Precision.fp32 if "cpu" in name else
                                                                           Precision.bf16)
    cells = expand([f"+experiment={name}", "quality.repeats=3"], cfg.hydra.sweeper.params)
    assert [c[0] for c in cells] == ["train.seed=0", "train.seed=1", "train.seed=2"]


def test_seed_experiments_are_the_seeds_cells():
    base = OmegaConf.to_object(compose_cfg(["+experiment=seed_baseline"]))
    best = OmegaConf.to_object(compose_cfg(["+experiment=seed_optimum"]))
    assert (base.seq_len, base.batch, best.seq_len, best.batch) == (1024, 4, 512, 8)
    assert base.lora.r == 16 and base.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert base.optimizer.lr == best.optimizer.lr == 2e-4


def test_any_integer_shape_reachable():
    cfg = OmegaConf.to_object(compose_cfg(["seq_len=768", "batch=6"]))
    assert (cfg.seq_len, cfg.batch) == (768, 6)


@pytest.mark.parametrize("override,message", [
    ("batch=foo", "could not be converted to Integer"),
    ("seq_len=1.5", "could not be converted to Integer"),
    ("sequence_len=512", "sequence_len"),  # a typo in a key
    ("lora.rank=8", "rank"),
    ("precision.name=int4", "Invalid value 'int4'"),
    ("train.gradient_checkpointing=maybe", "gradient_checkpointing"),
])
def test_bad_override_fails_at_composition(override, message):
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        compose_cfg([override])
    assert message in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize("option", ["jsonl", "hf"])
def test_user_data_without_a_path_is_refused(option):
    with pytest.raises(ValueError, match="data.path"):
        OmegaConf.to_object(compose_cfg([f"data={option}"]))


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        compose_cfg(["precision=int4"])
    assert "nf4" in str(e.value) and "fp32" in str(e.value)


@pytest.mark.parametrize("override,message", [
    ("seq_len=0", "seq_len must be > 0"),
    ("batch=-2", "batch must be > 0"),
    ("lora.r=0", "lora.r must be > 0"),
    ("lora.dropout=1.0", "lora.dropout"),
    ("train.untimed_steps=100", "no step would be timed"),
    ("model.num_key_value_heads=3", "multiple"),
    ("gpu.price_per_hour=-1", "gpu.price_per_hour must be >= 0"),
])
def test_range_checks_name_the_value(override, message):
    with pytest.raises(ValueError, match=message):
        OmegaConf.to_object(compose_cfg([override]))


def test_tiny_model_has_a_few_million_parameters():
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    cfg = OmegaConf.to_object(compose_cfg())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(cfg.model))
    n = sum(p.numel() for p in model.parameters())
    assert 2e6 < n < 20e6, n


def test_mistral_7b_architecture_matches_v0_3():
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    m = OmegaConf.to_object(compose_cfg(["model=mistral-7b-v0.3"])).model
    hf = hf_config(m)
    assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads,
            hf.intermediate_size, hf.vocab_size, hf.rope_parameters["rope_theta"]) == (32, 4096, 32, 8, 14336, 32768, 1e6)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    # Mistral-7B-v0.3's published parameter count: 7,248,023,552.
    assert sum(p.numel() for p in model.parameters()) == 7_248_023_552


@pytest.mark.parametrize("cell", sorted(f.stem for f in (CONF / "diag").glob("*.yaml")))
def test_every_diagnostic_cell_is_a_small_delta_on_the_baseline(cell):
    base = OmegaConf.to_object(compose_cfg(["+experiment=diagnostic"]))
    obj = OmegaConf.to_object(compose_cfg(["+experiment=diagnostic", f"diag={cell}"]))
    changed = {k for k in ("seq_len", "batch") if getattr(obj, k) != getattr(base, k)}
    changed |= {k for k in ("precision", "optimizer", "lora") if getattr(obj, k) != getattr(base, k)}
    expected = {"baseline": set(), "adamw_torch": {"optimizer"}, "lora_r8": {"lora"}, "seq512": {"seq_len"},
                "seq512_batch8": {"seq_len", "batch"}, "fp16": {"precision"}}[cell]
    assert changed == expected


def test_diagnostic_and_scaling_are_multiruns_over_the_seed_recipe():
    for name, params in (("diagnostic", {"diag"}), ("scaling", {"seq_len", "batch"}),
                         ("gpu_sizing", {"seq_len", "batch"})):
        cfg = compose_cfg([f"+experiment={name}"], return_hydra_config=True)
        assert cfg.hydra.mode.name == "MULTIRUN" and set(cfg.hydra.sweeper.params) == params
        assert cfg.precision.name.value == "nf4" and cfg.model.name == "mistral-7b-v0.3"


def test_wandb_mode_comes_from_the_environment_unless_set(monkeypatch):
    from lorabench.core.config import WandbConfig, WandbMode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert WandbConfig().resolved().mode is WandbMode.offline  # nothing set: offline
    monkeypatch.setenv("WANDB_MODE", "disabled")  # what k8s/configmap.yaml and the Dockerfile set
    assert WandbConfig().resolved().mode is WandbMode.disabled
    assert WandbConfig(mode=WandbMode.online).resolved().mode is WandbMode.online  # an explicit mode wins
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes' is not a W&B mode: use one of disabled, offline, "
                                         "online$"):
        WandbConfig().resolved()


def test_several_trackers_are_one_logger_option_list():
    """`logger=[mlflow,tensorboard]` turns both on (each option fills its own key); `logger=none` none."""
    def kinds(*overrides):
        return OmegaConf.to_object(compose_cfg(list(overrides)).logger).kinds

    assert kinds() == [] and kinds("logger=none") == [] and kinds("logger=[]") == []
    assert kinds("logger=[mlflow,tensorboard]") == ["mlflow", "tensorboard"]
    assert kinds("logger=[wandb,mlflow,tensorboard]", "logger.wandb.mode=offline") == [
        "wandb", "mlflow", "tensorboard"]
    assert kinds("logger=wandb", "logger.wandb.mode=disabled") == []  # disabled: no W&B run at all
    cfg = OmegaConf.to_object(compose_cfg(["logger=[wandb,mlflow]", "logger.wandb.project=p",
                                           "logger.mlflow.experiment=e"]).logger)
    assert (cfg.wandb.project, cfg.mlflow.experiment, cfg.tensorboard) == ("p", "e", None)


@pytest.mark.parametrize("old,new", [("train.timing_warmup_steps=3", "train.untimed_steps"),
                                     ("logger.project=p", "logger.wandb.project"),
                                     ("optimizer.warmup_steps=10", "optimizer.lr_warmup_steps"),
                                     ("+backend.pack=false", "data.packing")])
def test_a_renamed_key_is_refused_with_one_line_naming_the_new_one(old, new):
    from lorabench.core.config import renamed_key

    assert renamed_key(["seq_len=64", old]) == f"{old.lstrip('+').split('=')[0]} was renamed: use {new}" + \
        (" (backend=fast sets it)" if new == "data.packing" else "")
    assert renamed_key(["train.untimed_steps=3", "optimizer.lr_warmup_steps=2", "data.packing=true"]) is None


def test_a_renamed_key_on_the_command_line_stops_train_py_and_bench_py():
    from conftest import run_cli

    proc = run_cli("train.py", ["-m", "train.timing_warmup_steps=1,2"], check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == \
        "train.py: train.timing_warmup_steps was renamed: use train.untimed_steps"
    proc = run_cli("bench.py", ["suite=hardware", "backend.pack=true"], check=False)
    assert proc.returncode == 1 and "use data.packing" in proc.stderr.strip().splitlines()[-1]
