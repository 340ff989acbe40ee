"""lorabench: measure and run LoRA/QLoRA fine-tuning cells (see README.md)."""

import logging

# bitsandbytes logs a warning when it is imported (which transformers does on its first import)
# that its optional CPU kernels are missing. lorabench never runs bitsandbytes on a CPU
# (checks.check_device refuses it), so that one logger is quieted, here, before any import of it.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
