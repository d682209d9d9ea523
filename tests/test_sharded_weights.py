"""A reader trained with FSDP is never whole on one rank (issue 29): it is built on the meta
device, sharded, and each rank reads only its slices from the folder's safetensors; best_dev is
written by all ranks together and assembled piece by piece. These tests run 2 gloo ranks and
check that what comes out is exactly what the whole-model path gives: the same weights loaded
(every variant a folder records), the same folder exported, one clear error for a folder that
lacks a weight."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor

from fid.config import InitReaderConfig, ReaderTrainConfig
from fid.demo.tiny_models import build_tiny_t5
from fid.models.cross_attention_bias import CROSS_ATTENTION_BIAS, add_cross_attention_bias
from fid.models.folder_checks import ModelFolderError
from fid.models.loading import load_reader
from fid.models.settings import ReaderSettings
from fid.training.reader import ReaderTask, build_start_reader

WORLD = 2
DIMS = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=4, num_heads=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, folder: str, knobs: dict, export: str, out: str) -> None:
    """Builds the start reader as `fid train-reader` does under FSDP; writes what it saw."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    result: dict = {}
    try:
        cfg = ReaderTrainConfig(sharding="fsdp", **knobs)
        reader, tokenizer = build_start_reader(folder, cfg, torch.device("cpu"))
        params = dict(reader.t5.named_parameters())
        result["sharded"] = sorted(n for n, p in params.items() if isinstance(p, DTensor))
        result["local_fraction"] = sum(
            p.to_local().numel() for p in params.values() if isinstance(p, DTensor)
        ) / sum(p.numel() for p in params.values() if isinstance(p, DTensor))
        full = {
            n: (p.full_tensor() if isinstance(p, DTensor) else p.detach())
            for n, p in params.items()
        }
        if rank == 0:
            torch.save(full, Path(out) / "loaded.pt")
        if export:  # the plain case: also a training backward, with and without checkpointing
            result["checkpointing_grad_diff"] = _checkpointing_grad_diff(reader)
            task = ReaderTask.__new__(ReaderTask)  # save_model needs the model and tokenizer only
            task.model, task.tokenizer, task.cfg = reader, tokenizer, cfg
            task.save_model(Path(export), every_rank=True)
    except ModelFolderError as error:
        result["error"] = str(error)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _checkpointing_grad_diff(reader) -> float:
    """Largest gradient difference between a backward with activation checkpointing (switched
    on after sharding, as train_reader does) and one without; gradients are sharded DTensors."""
    torch.manual_seed(3)
    ids = torch.randint(3, 300, (2, 3, 12))
    labels = torch.randint(3, 300, (2, 4))
    reader.train()
    grads = []
    for checkpointing in (False, True):
        reader.set_activation_checkpointing(checkpointing)
        reader.zero_grad(set_to_none=True)
        reader(ids, torch.ones_like(ids), labels=labels).loss.backward()
        grads.append([p.grad.full_tensor() for p in reader.parameters() if isinstance(p, DTensor)])
    reader.set_activation_checkpointing(False)
    assert grads[0], "no sharded gradients"
    return max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True))


def _run(folder: Path, tmp_path: Path, export: bool = True, **knobs) -> tuple[list[dict], dict]:
    out = tmp_path / "out"
    out.mkdir(parents=True)
    target = tmp_path / "exported" if export else None
    if target:
        target.mkdir()
    args = (_free_port(), str(folder), knobs, str(target or ""), str(out))
    mp.spawn(_rank, args=args, nprocs=WORLD, join=True)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    loaded = torch.load(out / "loaded.pt") if (out / "loaded.pt").exists() else {}
    return results, loaded


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("start_model")
    torch.manual_seed(0)
    build_tiny_t5(InitReaderConfig(vocab_size=400, **DIMS), len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _whole(folder: Path, **variant) -> dict[str, torch.Tensor]:
    reader, _ = load_reader(str(folder), 1, True, **variant)
    return {n: p.detach() for n, p in reader.t5.named_parameters()}


def test_each_rank_reads_its_shards_and_the_export_is_save_pretrained_s(model_folder, tmp_path):
    results, loaded = _run(model_folder, tmp_path, dropout=0.0)
    whole = _whole(model_folder)
    assert loaded.keys() == whole.keys()
    for name, tensor in whole.items():
        assert torch.equal(loaded[name], tensor), name
    for result in results:
        assert result["checkpointing_grad_diff"] <= 1e-6, result
        assert result["sharded"], "no block was sharded"
        assert all(".block." in name for name in result["sharded"])
        assert result["local_fraction"] <= 0.5 + 0.05  # each rank holds its half of the blocks

    exported = tmp_path / "exported"
    reference = tmp_path / "reference"
    task = ReaderTask.__new__(ReaderTask)  # the single-process export of the same reader
    task.model, task.tokenizer = load_reader(str(model_folder), 1, True)
    task.cfg = ReaderTrainConfig()
    reference.mkdir()
    task.save_model(reference)
    assert sorted(p.name for p in exported.iterdir()) == sorted(
        p.name for p in reference.iterdir()
    ), "the sharded export's files differ from the single-process export's"
    ours, theirs = (
        load_file(exported / "model.safetensors"),
        load_file(reference / "model.safetensors"),
    )
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]) and ours[name].dtype == theirs[name].dtype
    # transformers loads it (its header has no {"format": "pt"}: accepted, as for files that
    # safetensors itself wrote)
    again = _whole(exported)
    assert all(torch.equal(again[n], whole[n]) for n in whole)


def test_a_fido_variant_and_a_kept_cross_attention_bias_load_as_the_whole_model(
    model_folder, tmp_path, tokenizer
):
    # FiDO: a dense folder fine-tuned into cross-attention in every 2nd decoder layer
    _, loaded = _run(model_folder, tmp_path / "fido", export=False, cross_attention_every=2)
    whole = _whole(model_folder, cross_attention_every=2)
    assert loaded.keys() == whole.keys() and len(whole) < len(_whole(model_folder))
    assert all(torch.equal(loaded[n], whole[n]) for n in whole)

    # a converted original reader that keeps transformers 3's cross-attention bias
    biased = tmp_path / "biased"
    t5 = build_tiny_t5(InitReaderConfig(vocab_size=400, **DIMS), len(tokenizer))
    add_cross_attention_bias(t5, torch.randn(32, DIMS["num_heads"]))
    t5.save_pretrained(biased)
    tokenizer.save_pretrained(biased)
    ReaderSettings(cross_attention_bias=True).save(biased)
    _, loaded = _run(biased, tmp_path / "bias", export=False, pack_passages=False)
    whole = _whole(biased)
    assert CROSS_ATTENTION_BIAS in loaded
    assert loaded.keys() == whole.keys()
    assert all(torch.equal(loaded[n], whole[n]) for n in whole)


def test_a_folder_lacking_a_weight_is_one_clear_error_on_every_rank(model_folder, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in model_folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    weights = load_file(broken / "model.safetensors")
    name = "decoder.block.1.layer.0.SelfAttention.q.weight"
    del weights[name]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    results, _ = _run(broken, tmp_path, export=False)
    for result in results:
        assert result["error"].startswith(f"{broken}: its safetensors do not hold")
        assert f"missing {name}" in result["error"]


def test_where_the_weights_are_read_from(model_folder, tmp_path, monkeypatch):
    """A folder's own safetensors; a hub name's cached snapshot (safetensors and configs only,
    never the other weight files); None where there are no safetensors (then every rank loads
    the whole model, with a warning)."""
    import huggingface_hub

    from fid.models.loading import weights_folder

    assert weights_folder(str(model_folder)) == model_folder
    asked = {}

    def snapshot(name, allow_patterns):
        asked[name] = allow_patterns
        return str(model_folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert weights_folder("google-t5/t5-11b") == model_folder
    assert asked == {"google-t5/t5-11b": ["*.safetensors", "*.json"]}
    legacy = tmp_path / "legacy"  # an older folder with pytorch_model.bin only
    legacy.mkdir()
    (legacy / "config.json").write_text((model_folder / "config.json").read_text())
    torch.save(load_file(model_folder / "model.safetensors"), legacy / "pytorch_model.bin")
    assert weights_folder(str(legacy)) is None


def test_an_untied_lm_head_flan_t5s_loads_untied(tmp_path, tokenizer):
    """T5 v1.1 / flan-t5 have an lm_head of their own; transformers 5 builds every T5 from its
    config tied (config.json's `tie_word_embeddings: false` survives as scale_decoder_outputs)
    and unties only when a checkpoint holds a different lm_head: the sharded build, made from
    the config, must untie it too, or the reader would silently predict through `shared`."""
    from transformers import T5Config, T5ForConditionalGeneration

    untied = tmp_path / "untied"
    config = T5Config(vocab_size=len(tokenizer), tie_word_embeddings=False,
                      decoder_start_token_id=0, pad_token_id=0, **DIMS)  # fmt: skip
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(config)
    t5.lm_head.weight = torch.nn.Parameter(torch.randn_like(t5.shared.weight))
    t5.save_pretrained(untied)
    tokenizer.save_pretrained(untied)
    whole = _whole(untied)
    assert "lm_head.weight" in whole  # the whole-model path loads it untied
    _, loaded = _run(untied, tmp_path)
    assert loaded.keys() == whole.keys()
    assert all(torch.equal(loaded[n], whole[n]) for n in whole)
    assert not torch.equal(loaded["lm_head.weight"], loaded["shared.weight"])
    exported = load_file(tmp_path / "exported" / "model.safetensors")  # its own lm_head kept
    assert torch.equal(exported["lm_head.weight"], whole["lm_head.weight"])
    assert all(torch.equal(_whole(tmp_path / "exported")[n], whole[n]) for n in whole)
