"""Every transformers model fid loads from a hub name or a folder goes through `load_pretrained`.

Why one place: transformers 5 (5.25 measured) "kernelizes" a model in `from_pretrained` by
default (`use_kernels=None` means on): where the `kernels` package finds a mapping for a layer
on the device (BERT's GELU on CUDA, for one), it replaces the layer's forward with a kernel
downloaded from the Hugging Face Hub at load time. On a compute node without network that load
fails (seen on an H200: "Kernel repository 'kernels-community/activation' could not verify
publisher trust status"), and where it succeeds the model no longer runs the code fid's
equality tests with the original FiD checked. fid runs the model's own modules, always.
"""

from __future__ import annotations

from typing import Any


def load_pretrained(model_class: Any, name_or_path: str, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(name_or_path, **kwargs)` without hub kernels."""
    return model_class.from_pretrained(name_or_path, use_kernels=False, **kwargs)
