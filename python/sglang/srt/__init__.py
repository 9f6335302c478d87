"""The serving runtime."""

import logging

# transformers imports torchao (when installed) with its quantizer registry; on a CPU torchao then
# logs that its CUDA kernels cannot load and torch warns about its enum registrations, on every
# process start. Neither is actionable here.
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
