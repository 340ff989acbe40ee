"""lorabench: measure and run LoRA/QLoRA fine-tuning cells (see README.md)."""

import logging

# The one home of the version: pyproject.toml reads it (setuptools' dynamic version), and so do the
# image's tag (docker/image.sh, `make image`) and the Kubernetes Jobs' default image (lorabench.sweep.k8s).
__version__ = "0.1.0"

# bitsandbytes logs a warning when it is imported (which transformers does on its first import)
# that its optional CPU kernels are missing. lorabench never runs bitsandbytes on a CPU
# (checks.check_device refuses it), so that one logger is quieted, here, before any import of it.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
