"""train.memory_snapshot: one untimed step's allocator history, and what was allocated at its peak by the call that
made it. The arithmetic on a trace written here; a cell's on a GPU (marked)."""

import json

import pytest
import torch
from conftest import compose_cfg, requires_cuda, run_in_process
from omegaconf import OmegaConf

from lorabench.measure.memory_snapshot import GIB, at_peak, site


def frame(path, name):
    return {"filename": path, "name": name, "line": 1}


SITE_PACKAGES = "/venv/lib/python3.11/site-packages"
MLP = [frame(f"{SITE_PACKAGES}/torch/nn/functional.py", "silu"),
       frame(f"{SITE_PACKAGES}/transformers/models/llama/modeling_llama.py", "forward"),
       frame("/work/src/lorabench/fast/tiled.py", "_in_tiles")]
LOSS = [frame(f"{SITE_PACKAGES}/liger_kernel/ops/fused_linear_cross_entropy.py", "fused_linear_cross_entropy_forward")]


def test_a_site_is_the_innermost_frame_in_a_package_that_trains():
    assert site(MLP) == "transformers/models/llama/modeling_llama.py:forward"
    assert site(LOSS) == "liger_kernel/ops/fused_linear_cross_entropy.py:fused_linear_cross_entropy_forward"
    assert site([frame("/usr/lib/python3.11/threading.py", "run")]) == "threading.py:run" and site([]) == "?"


def test_the_peak_is_the_step_s_highest_point_and_its_sites_the_blocks_alive_there():
    """The MLP's blocks of 1 and 2 GiB alive with the loss's 3 (6 GiB held), after a 1 GiB block allocated before
    the step was freed: the peak is before + 6 - 1 GiB. The later 4 GiB block comes after all three were freed
    (4 - 1 GiB held): no higher point."""
    g = GIB
    trace = [
        {"action": "alloc", "addr": 1, "size": 1 * g, "frames": MLP},
        {"action": "alloc", "addr": 2, "size": 2 * g, "frames": MLP},
        {"action": "free_requested", "addr": 99, "size": 1 * g},  # a block from before the step
        {"action": "alloc", "addr": 3, "size": 3 * g, "frames": LOSS},
        {"action": "free_completed", "addr": 3, "size": 3 * g},  # (the request is what counts)
        {"action": "free_requested", "addr": 3, "size": 3 * g},
        {"action": "free_requested", "addr": 1, "size": 1 * g},
        {"action": "free_requested", "addr": 2, "size": 2 * g},
        {"action": "alloc", "addr": 4, "size": 4 * g, "frames": LOSS},
    ]
    r = at_peak(trace, before_bytes=10 * g)
    assert r.before_gib == 10 and r.peak_gib == 10 + 6 - 1
    assert r.sites == [{"site": site(MLP), "gib": 3.0, "blocks": 2}, {"site": site(LOSS), "gib": 3.0, "blocks": 1}]


def test_memory_snapshot_needs_cuda_and_a_timed_step_after_it():
    from lorabench.run import checks

    c = OmegaConf.to_object(compose_cfg(["train.memory_snapshot=true"]))
    with pytest.raises(RuntimeError, match="train.memory_snapshot=true records PyTorch's CUDA allocator; this cell "
                                           "runs on cpu"):
        checks.check_device(c, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"train.max_steps=6 would leave no step timed; use train.max_steps >= 7"):
        OmegaConf.to_object(compose_cfg(["train.memory_snapshot=true", "train.max_steps=6", "train.untimed_steps=3",
                                         "train.profile_steps=2"]))


@pytest.mark.gpu
@requires_cuda
def test_a_cell_writes_its_snapshot_and_its_peak_on_a_gpu(tmp_path):
    cell = ["train.memory_snapshot=true", "train.max_steps=8", "train.untimed_steps=2", "train.device=cuda"]
    r = run_in_process(cell, tmp_path)
    assert r.ok, r.error
    peak = json.loads((tmp_path / "memory_at_peak.json").read_text())
    assert (tmp_path / "memory_snapshot.pickle").stat().st_size > 0 and peak["sites"]
    assert peak["before_gib"] < peak["peak_gib"] <= r.metrics["mem/peak_allocated_gib"] + 1e-6
    assert r.metrics["count/timed_steps"] == 8 - 3
