"""train.py with transformers' gradient checkpointing in its reentrant form (torch.utils.checkpoint with
use_reentrant=True, what transformers 4.x used when no kwargs were given, as the trl_l4 source's TRL 0.9.6 run did)
instead of lorabench's non-reentrant one; the input embeddings' output made to require grad, as PEFT does for the
reentrant form (its inputs must require grad for the adapters to get theirs). A measurement only:

    python docs/runs/scripts/reentrant_train.py <train.py arguments...>
"""
import runpy
import sys

import transformers

enable = transformers.PreTrainedModel.gradient_checkpointing_enable


def reentrant(self, gradient_checkpointing_kwargs=None):
    enable(self, gradient_checkpointing_kwargs={"use_reentrant": True})
    self.enable_input_require_grads()


transformers.PreTrainedModel.gradient_checkpointing_enable = reentrant
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
