"""A sharded reader's weights read from, and written to, a Hugging Face model folder, without
the whole model ever held by one rank.

FSDP exists for readers that one device cannot hold, so neither end of a run may gather them:
- loading: the reader is built on the meta device (no memory; fid.models.loading.reader_skeleton),
  its blocks sharded, and each rank reads from the folder's safetensors only the rows of its
  own shards (and the small replicated tensors whole);
- export: each rank writes its shards, and rank 0 consolidates them into the folder's
  `model.safetensors` piece by piece, so the folder is the one `save_pretrained` writes.

Both go through torch.distributed.checkpoint's Hugging Face storage reader and writer, which
read safetensors slices and stream the consolidation; this module maps the reader's parameter
names onto the file's and checks the file before anything is read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

from fid.models.folder_checks import ModelFolderError

WEIGHTS_FILE = "model.safetensors"  # what save_pretrained writes for one file


def _named_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters by their names in its own state dict (tied weights once, by
    their first name: T5's embedding is `shared.weight`, as save_pretrained writes it)."""
    return {name: parameter.detach() for name, parameter in module.named_parameters()}


def _full_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)  # a DTensor's shape is the full one, not its shard's


def load_weights_into_shards(module: nn.Module, folder: str | Path) -> None:
    """Fills `module`'s parameters (DTensor shards or replicated tensors, already on their
    device) from the safetensors file(s) in `folder`; every rank must call it.

    Each rank reads only the slices it holds. The folder may hold more tensors than the module
    (e.g. cross-attention layers a FiDO fine-tune removes); it may not hold fewer.

    Raises:
        ModelFolderError: a parameter the folder lacks, or one of another shape.
    """
    folder = Path(folder)
    reader = HuggingFaceStorageReader(str(folder))
    stored = reader.read_metadata().state_dict_metadata  # the files' headers only
    weights = _named_weights(module)
    problems = [f"missing {name}" for name in sorted(weights) if name not in stored]
    problems += [
        f"{name}: {tuple(stored[name].size)} in the folder, {_full_shape(weights[name])} expected"
        for name in sorted(weights)
        if name in stored and tuple(stored[name].size) != _full_shape(weights[name])
    ]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ModelFolderError(
            f"{folder}: its safetensors do not hold this reader's weights: "
            + "; ".join(problems[:5])
            + more
        )
    dcp.load(weights, storage_reader=HuggingFaceStorageReader(str(folder)))


def export_weights_from_shards(module: nn.Module, folder: str | Path) -> None:
    """Writes `module`'s full weights into `folder`/model.safetensors as save_pretrained would;
    every rank must call it, with the same (shared) folder.

    Each rank writes its shards into `folder`/sharded; rank 0 then assembles the one file from
    them a tensor piece at a time (torch's consolidation), so no rank holds the whole model.
    """
    folder = Path(folder)
    writer = HuggingFaceStorageWriter(str(folder), save_distributed=True, enable_consolidation=True)
    dcp.save(_named_weights(module), storage_writer=writer)
    dist.barrier()  # every rank is past the save before rank 0 tidies the folder
    if dist.get_rank() == 0:
        # one consolidated file: named as save_pretrained names it, with no index beside it
        (single,) = folder.glob("model-*-of-*.safetensors")
        os.replace(single, folder / WEIGHTS_FILE)
        (folder / "model.safetensors.index.json").unlink(missing_ok=True)
        shutil.rmtree(folder / "sharded")
    dist.barrier()
