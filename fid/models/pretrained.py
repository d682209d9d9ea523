"""Every transformers model fid loads from a hub name or a folder goes through `load_pretrained`.

Why one place: transformers 5 (5.25 measured) "kernelizes" a model in `from_pretrained` by
default (`use_kernels=None` means on): where the `kernels` package finds a mapping for a layer
on the device (BERT's GELU on CUDA, for one), it replaces the layer's forward with a kernel
downloaded from the Hugging Face Hub at load time. On a compute node without network that load
fails (seen on an H200: "Kernel repository 'kernels-community/activation' could not verify
publisher trust status"), and where it succeeds the model no longer runs the code fid's
equality tests with the original FiD checked. fid runs the model's own modules, always.

And in fp32: transformers 5 loads a folder in the dtype its weights were saved in (`dtype`
"auto"), so a bf16 folder became bf16 weights on the unsharded path while FSDP built fp32 ones:
the two trained different models, and bf16 master weights lose small updates. Every load is
fp32 (the master weights); bf16/fp16 is autocast's, per operation (fid.runtime.precision).
"""

from __future__ import annotations

from typing import Any

import torch


def load_pretrained(model_class: Any, name_or_path: str, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(name_or_path, **kwargs)` without hub kernels, in fp32
    whatever dtype the folder holds (unless `dtype` is given)."""
    kwargs.setdefault("dtype", torch.float32)
    return model_class.from_pretrained(name_or_path, use_kernels=False, **kwargs)
