"""Memory per rank of FSDP training (fid.training.sharding) at 1, 2 and 4 gloo ranks.

    python benchmarks/fsdp_memory.py                      # d_model 1024, 4+4 layers
    python benchmarks/fsdp_memory.py --small --json m.json  # what tests/test_sharding.py runs

A reader wide enough that parameters dominate. Each rank builds the same model (same seed),
shards its T5 blocks as `fid train-reader` does (world > 1), and runs one AdamW step and one
greedy generation (dev evaluation). Counted on each rank, as the bytes of the tensors it holds
(a DTensor counts its local shard):
- params / grads / optimizer states after the step (the step's end is where all three exist;
  during the backward a unit's gathered weights come on top, counted below);
- units gathered at once: the most T5 blocks holding full (unsharded) weights at any moment of
  the training forward and of the generation, seen from forward hooks;
- expected: the sharded blocks' total / world + the replicated tensors (embedding, final norms);
- peak RSS above the process's RSS before the model was built (VmHWM - VmRSS), which also sees
  the model built whole before it is sharded (every rank loads the full model today).

Prints one table; `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fid.config import InitReaderConfig  # noqa: E402
from fid.demo.tiny_models import build_tiny_t5  # noqa: E402
from fid.models.reader import FiDReader  # noqa: E402
from fid.training import sharding  # noqa: E402
from fid.training.optim import build_optimizer  # noqa: E402

MB = 2**20


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


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


def _rank(rank: int, world: int, port: int, dims: dict, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    baseline_kb = _status_kb("VmRSS")
    torch.manual_seed(0)
    config = InitReaderConfig(**dims)
    reader = FiDReader(build_tiny_t5(config, dims["vocab_size"]), encoder_buckets=1)
    units = reader.fsdp_units()
    whole = _bytes(reader.parameters())
    sharded_total = _bytes(p for u in units for p in u.parameters())
    replicated_bytes = whole - sharded_total  # embedding (tied LM head), final norms
    replicated = list(reader.parameters())
    if world > 1:
        replicated = sharding.shard(reader, units)
    gathered = GatheredUnits(units)
    optimizer = build_optimizer(reader, 1e-4, 0.0)

    ids = torch.randint(3, dims["vocab_size"], (2, 2, 16))
    mask = torch.ones_like(ids)
    labels = torch.randint(3, dims["vocab_size"], (2, 4))
    reader.train()
    reader(ids, mask, labels=labels).loss.backward()
    train_gathered = gathered.most
    if world > 1:
        sharding.average_replicated_gradients(replicated)
    optimizer.step()
    params = _bytes(reader.parameters())
    grads = _bytes(p.grad for p in reader.parameters() if p.grad is not None)
    states = _optimizer_bytes(optimizer)
    gathered.most = 0
    reader.eval()
    with torch.no_grad():
        reader.generate(ids, mask, 4)
    eval_gathered = gathered.most
    expected = sharded_total / world + replicated_bytes
    row = dict(
        world=world, rank=rank, params_mb=params / MB, grads_mb=grads / MB,
        optimizer_mb=states / MB, expected_params_mb=expected / MB, whole_model_mb=whole / MB,
        replicated_mb=replicated_bytes / MB, units=len(units), gathered_in_training=train_gathered, gathered_in_eval=eval_gathered,
        peak_rss_above_baseline_mb=(_status_kb("VmHWM") - baseline_kb) / 1024,
    )  # fmt: skip
    with open(f"{out}.{world}.{rank}", "w") as file:
        json.dump(row, file)
    dist.destroy_process_group()


def run(worlds: list[int], dims: dict, out: Path) -> list[dict]:
    rows = []
    for world in worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_rank, args=(world, port, dims, str(out)), nprocs=world, join=True)
        for rank in range(world):
            part = Path(f"{out}.{world}.{rank}")
            rows.append(json.loads(part.read_text()))
            part.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--small", action="store_true", help="d_model 64 (the test's size)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if args.small:
        dims = dict(d_model=64, d_ff=256, d_kv=16, num_heads=4, num_layers=2,
                    num_decoder_layers=2, vocab_size=300)  # fmt: skip
    else:
        dims = dict(d_model=1024, d_ff=4096, d_kv=128, num_heads=8, num_layers=4,
                    num_decoder_layers=4, vocab_size=8000)  # fmt: skip
    with tempfile.TemporaryDirectory() as parts:  # each rank's row, until all are read
        rows = run(args.worlds, dims, Path(parts) / "row")
    print(f"reader {dims}")
    print("world rank | params MB (expected) | grads MB | AdamW MB | units gathered train/eval "
          "| peak RSS above baseline MB")  # fmt: skip
    for r in rows:
        print(f"{r['world']:5d} {r['rank']:4d} | {r['params_mb']:8.1f} ({r['expected_params_mb']:6.1f})"
              f" | {r['grads_mb']:8.1f} | {r['optimizer_mb']:8.1f} | "
              f"{r['gathered_in_training']}/{r['gathered_in_eval']} of {r['units']} | "
              f"{r['peak_rss_above_baseline_mb']:8.1f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
