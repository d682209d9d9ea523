"""Memory per rank of FSDP training (fid.training.sharding) at 1, 2 and 4 gloo ranks.

    python benchmarks/distributed/fsdp_memory.py                      # d_model 1024, 4+4 layers
    python benchmarks/distributed/fsdp_memory.py --small --json m.json  # what tests/test_sharding.py runs

A reader wide enough that parameters dominate, saved once as a model folder. Each rank lives
through what `fid train-reader` does with it: the start reader built (world > 1: sharded from
the meta device, each rank reading its own slices: fid.training.sharded_weights; world 1: the
whole model, as an unsharded run loads it), one AdamW step, one greedy generation (dev
evaluation), a checkpoint written and read back, and the model exported. Counted on each rank:
- params / grads / optimizer states after the step, as the bytes of the tensors the rank holds
  (a DTensor counts its local shard); during the backward a unit's gathered weights come on
  top, counted below;
- units gathered at once: the most T5 blocks holding full (unsharded) weights at any moment of
  the training forward and of the generation, seen from forward hooks;
- expected: the sharded blocks' total / world + the replicated tensors (embedding, final norms);
- held gradients between two micro-batches of one step, under each `fsdp_gradient_sync`:
  every_micro_batch holds the expected shard, last_micro_batch every unit's whole gradients
  (sharding.held_gradient_bytes);
- peak RSS above the process's RSS before the model was built, for each phase (VmHWM reset
  through /proc/self/clear_refs at its start) and over the whole run.

Prints one table; `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks.*` from anywhere

from benchmarks.harness import (  # noqa: E402
    MIB,
    memory_now,
    memory_peak,
    record,
    reset_peak,
    write_record,
)
from fid.config import InitReaderConfig, ReaderTrainConfig  # noqa: E402
from fid.demo.tiny_models import build_tiny_t5, train_tokenizer  # noqa: E402
from fid.training import sharding  # noqa: E402
from fid.training.checkpoint import (  # noqa: E402
    TrainingProgress,
    load_checkpoint,
    save_checkpoint,
)
from fid.training.optim import build_optimizer  # noqa: E402
from fid.training.reader import build_start_reader  # noqa: E402
from fid.training.sharded_weights import export_weights_from_shards  # noqa: E402
from fid.training.step import reduce_scatter_now  # noqa: E402


def _bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _bytes(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value) and value.dim() > 0
    )


class GatheredUnits:
    """The most units holding their full weights at once, seen as each unit's forward starts
    (a pre-hook registered after FSDP's own, which gathers the unit)."""

    def __init__(self, units):
        self.units, self.most = units, 0
        for unit in units:
            unit.register_forward_pre_hook(self._count)

    def _count(self, *_):
        from torch.distributed.tensor import DTensor

        full = sum(not isinstance(next(u.parameters()), DTensor) for u in self.units)
        self.most = max(self.most, full)


PHASES = ("load", "train_step", "evaluation", "checkpoint_save", "checkpoint_load", "export")


class PhasePeaks:
    """Peak RSS above the baseline in each phase: VmHWM is reset as a phase starts."""

    def __init__(self):
        self.baseline = memory_now()
        self.mb: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        reset_peak()  # VmHWM := VmRSS
        yield
        dist.barrier()
        self.mb[name] = (memory_peak() - self.baseline) / MIB


def _full_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)  # a DTensor's numel is the full one


def _rank(rank: int, world: int, port: int, dims: dict, folder: str, scratch: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    scratch = Path(scratch)
    peaks = PhasePeaks()
    cfg = ReaderTrainConfig(sharding="fsdp", encoder_buckets=1)
    with peaks.phase("load"):
        reader, _ = build_start_reader(folder, cfg, torch.device("cpu"))
        units = reader.fsdp_units()
        replicated = sharding.shard(reader, units) if world > 1 else list(reader.parameters())
        optimizer = build_optimizer(reader, 1e-4, 0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    whole = _full_bytes(reader.parameters())
    sharded_total = _full_bytes(p for u in units for p in u.parameters())
    replicated_bytes = whole - sharded_total  # embedding (tied LM head), final norms
    gathered = GatheredUnits(units)

    torch.manual_seed(1)
    ids = torch.randint(3, dims["vocab_size"], (2, 2, 16))
    mask = torch.ones_like(ids)
    labels = torch.randint(3, dims["vocab_size"], (2, 4))
    with peaks.phase("train_step"):
        reader.train()
        reader(ids, mask, labels=labels).loss.backward()
        if world > 1:
            sharding.average_replicated_gradients(replicated)
        optimizer.step()
        scheduler.step()
    train_gathered = gathered.most
    params = _bytes(reader.parameters())
    grads = _bytes(p.grad for p in reader.parameters() if p.grad is not None)
    states = _optimizer_bytes(optimizer)
    # Gradient accumulation: what a rank holds between two micro-batches of one step, under
    # each fsdp_gradient_sync (the step's own choice, fid.training.step.reduce_scatter_now)
    held = {}
    for policy in ("every_micro_batch", "last_micro_batch"):
        optimizer.zero_grad(set_to_none=True)
        policy_cfg = ReaderTrainConfig(sharding="fsdp", fsdp_gradient_sync=policy)
        if world > 1:
            sharding.set_gradient_sync(units, reduce_scatter_now(policy_cfg, last=False))
        reader(ids, mask, labels=labels).loss.backward()  # a first micro-batch of two
        held[policy] = sharding.held_gradient_bytes(reader, units) / MIB
        if world > 1:
            sharding.set_gradient_sync(units, True)
            reader(ids, mask, labels=labels).loss.backward()  # the last: reduce-scattered
        optimizer.zero_grad(set_to_none=True)
    gathered.most = 0
    with peaks.phase("evaluation"):
        reader.eval()
        with torch.no_grad():
            reader.generate(ids, mask, 4)
    eval_gathered = gathered.most

    checkpoint = scratch / "checkpoint"
    with peaks.phase("checkpoint_save"):
        if world > 1:
            sharding.save_sharded(checkpoint, reader, optimizer)
        else:
            progress = TrainingProgress(step=1)
            saved = save_checkpoint(scratch, reader, optimizer, scheduler, None, progress, {}, 1)
    with peaks.phase("checkpoint_load"):
        if world > 1:
            sharding.load_sharded(checkpoint, reader, optimizer)
        else:
            load_checkpoint(saved, reader, optimizer, scheduler, None)
    with peaks.phase("export"):
        (scratch / "export").mkdir(exist_ok=True)
        if world > 1:
            export_weights_from_shards(reader.t5, scratch / "export")
        else:
            reader.save_pretrained(scratch / "export")

    expected = sharded_total / world + replicated_bytes
    row = dict(
        world=world, rank=rank, params_mb=params / MIB, grads_mb=grads / MIB,
        optimizer_mb=states / MIB, expected_params_mb=expected / MIB, whole_model_mb=whole / MIB,
        replicated_mb=replicated_bytes / MIB, units=len(units), gathered_in_training=train_gathered,
        held_grads_mb_every_micro_batch=held["every_micro_batch"],
        held_grads_mb_last_micro_batch=held["last_micro_batch"],
        unsharded_units_mb=sharded_total / MIB,
        gathered_in_eval=eval_gathered, peak_rss_mb=peaks.mb,
        peak_rss_above_baseline_mb=max(peaks.mb.values()),
    )  # fmt: skip
    (scratch / f"row.{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def _save_start_model(dims: dict, folder: Path) -> None:
    torch.manual_seed(0)
    build_tiny_t5(InitReaderConfig(**dims), dims["vocab_size"]).save_pretrained(folder)
    texts = ["who wrote the book", "the book was written in 1901 by a writer"]
    train_tokenizer(texts, vocab_size=100).save_pretrained(folder)


def run(worlds: list[int], dims: dict, root: Path) -> list[dict]:
    folder = root / "start_model"
    _save_start_model(dims, folder)
    rows = []
    for world in worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        scratch = root / f"world{world}"
        scratch.mkdir()
        args = (world, port, dims, str(folder), str(scratch))
        mp.spawn(_rank, args=args, nprocs=world, join=True)
        rows += [json.loads((scratch / f"row.{rank}.json").read_text()) for rank in range(world)]
        shutil.rmtree(scratch)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--small", action="store_true", help="d_model 64 (the test's size)")
    parser.add_argument("--json", type=Path, help="also write the run's record here")
    args = parser.parse_args()
    if args.small:
        dims = dict(d_model=64, d_ff=256, d_kv=16, num_heads=4, num_layers=2,
                    num_decoder_layers=2, vocab_size=300)  # fmt: skip
    else:
        dims = dict(d_model=1024, d_ff=4096, d_kv=128, num_heads=8, num_layers=4,
                    num_decoder_layers=4, vocab_size=8000)  # fmt: skip
    with tempfile.TemporaryDirectory() as root:  # the start model, checkpoints, exports
        rows = run(args.worlds, dims, Path(root))
    print(f"reader {dims}")
    print("world rank | params MB (expected) | grads MB | AdamW MB | units gathered train/eval "
          "| peak RSS above baseline MB: " + " / ".join(PHASES) + " | all")  # fmt: skip
    for r in rows:
        print(f"{r['world']:5d} {r['rank']:4d} | {r['params_mb']:8.1f} ({r['expected_params_mb']:6.1f})"
              f" | {r['grads_mb']:8.1f} | {r['optimizer_mb']:8.1f} | "
              f"{r['gathered_in_training']}/{r['gathered_in_eval']} of {r['units']} | "
              + " / ".join(f"{r['peak_rss_mb'][p]:.0f}" for p in PHASES)
              + f" | {r['peak_rss_above_baseline_mb']:.0f}")  # fmt: skip
    print("world rank | gradients held between micro-batches, MB: every_micro_batch / "
          "last_micro_batch (the units whole: MB)")  # fmt: skip
    for r in rows:
        print(
            f"{r['world']:5d} {r['rank']:4d} | {r['held_grads_mb_every_micro_batch']:8.1f} / "
            f"{r['held_grads_mb_last_micro_batch']:8.1f} ({r['unsharded_units_mb']:.1f})"
        )
    if args.json:
        write_record(args.json, record(__file__, rows))


if __name__ == "__main__":
    main()
