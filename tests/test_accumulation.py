"""Gradient accumulation weighs every item of an optimizer step alike: k uneven micro-batches on
one rank, and 2 gloo ranks with uneven shares, give the gradient of the one big batch (float64,
within round-off), where a mean of micro-batch means does not."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import socket
import subprocess
import sys

import torch
from conftest import write_json

from fid.config import ReaderTrainConfig, RetrieverTrainConfig
from fid.data.examples import load_examples
from fid.models.loading import load_reader
from fid.training.accumulation import accumulate_gradients, loss_weights
from fid.training.reader import ReaderTask
from fid.training.retriever import RetrieverTask
from fid.training.retriever_examples import distillation_examples

CPU = torch.device("cpu")
# Targets of 1 to 6 words: micro-batches of 1 to 4 questions hold 2 to 20 target tokens.
TARGETS = ["a", "b c d e f", "g h", "i j k", "l", "m n o p q r", "s t", "u", "v w x y", "z"]
UNEVEN = [[0, 1, 2], [3], [4, 5, 6, 7], [8, 9]]
READER = dict(n_passages=2, passage_max_tokens=24, dropout=0.0, precision="fp32",
              tensorboard=False)  # fmt: skip


def _reader_task(model_dir, train_path):
    reader, tokenizer = load_reader(str(model_dir), 2, True, dropout=0.0)
    reader = reader.double().train()
    task = ReaderTask(reader, tokenizer, ReaderTrainConfig(**READER), load_examples(train_path),
                      [], CPU)  # fmt: skip
    return reader, task


def _gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _union_gradients(model, task, indices) -> dict[str, torch.Tensor]:
    model.zero_grad()
    task.loss(model, indices).backward()
    return _gradients(model)


def _close(got: dict, want: dict, rtol: float = 1e-10) -> bool:
    return all(torch.allclose(got[n], want[n], rtol=rtol, atol=rtol / 100) for n in want)


def _close_in_scale(got: dict, want: dict, rtol: float) -> bool:
    """`_close`, with each entry also allowed rtol of its tensor's largest entry: fp32
    round-off is relative to the terms summed, so an entry that cancels to near zero carries
    the absolute error of its terms (the token-type embedding's gradient: 3.3e-7 off in a
    tensor whose largest entry is 0.069 on one machine; element-wise rtol 1e-5 passed on
    another). Tensors that are zero in exact arithmetic (the keys' bias) keep `_close`'s floor."""
    return all(
        torch.allclose(
            got[n], want[n], rtol=rtol, atol=max(rtol / 100, rtol * float(want[n].abs().max()))
        )  # fmt: skip
        for n in want
    )


def _train_file(tmp_path, toy_records):
    records = [dict(r, target=t) for r, t in zip(toy_records["train"], TARGETS, strict=False)]
    return write_json(tmp_path / "train.json", records)


def test_uneven_micro_batches_give_the_gradient_of_their_union(
    tmp_path, tiny_model_dir, toy_records
):
    reader, task = _reader_task(tiny_model_dir, _train_file(tmp_path, toy_records))
    batches = [(0, b) for b in UNEVEN]
    items = [task.loss_items(b) for b in batches]
    assert len(set(items)) == len(items)  # every micro-batch a different number of tokens
    union = _union_gradients(reader, task, (0, sum(UNEVEN, [])))

    reader.zero_grad()
    loss = accumulate_gradients(task, reader, batches, 1, CPU, contextlib.nullcontext(), None,
                                lambda last: contextlib.nullcontext())  # fmt: skip
    assert _close(_gradients(reader), union)
    torch.testing.assert_close(loss, task.loss(reader, (0, sum(UNEVEN, []))).detach())

    # ... where the mean of the micro-batch means (loss / accumulation steps) is another
    # gradient: the test tells the two apart
    reader.zero_grad()
    for batch in batches:
        (task.loss(reader, batch) / len(batches)).backward()
    assert not _close(_gradients(reader), union)


def test_equal_micro_batches_weigh_one_over_the_steps(tmp_path, tiny_model_dir, toy_records):
    records = [dict(r, target="x y") for r in toy_records["train"][:6]]
    _, task = _reader_task(tiny_model_dir, write_json(tmp_path / "t.json", records))
    assert loss_weights(task, [(0, [0, 1]), (0, [2, 3]), (0, [4, 5])], 1, CPU) == [1 / 3] * 3


def test_retriever_questions_weigh_alike(tmp_path, toy_records):
    """The retriever's loss averages questions ("batchmean") or (question, passage) pairs
    ("mean", the original's): either way uneven micro-batches give the union's gradient."""
    from fid.config import InitRetrieverConfig
    from fid.demo.tiny_models import init_retriever
    from fid.models.retriever import DualEncoder

    records = copy.deepcopy(toy_records["train"][:10])
    for record in records:
        for rank, ctx in enumerate(record["ctxs"]):
            ctx["reader_score"] = float(len(record["ctxs"]) - rank)
    scored = write_json(tmp_path / "scored.json", records)
    init = tmp_path / "bert"
    init_retriever(InitRetrieverConfig(vocab_size=200, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=32, dropout=0.0), [scored], init)  # fmt: skip
    examples = load_examples(scored)
    for reduction in ("batchmean", "mean"):
        model, tokenizer = DualEncoder.from_pretrained(init)
        model = model.double().train()
        cfg = RetrieverTrainConfig(n_passages=3, in_batch_negatives=False, kl_reduction=reduction,
                                   eval_k=[1], select_on="candidate_agreement@1",
                                   precision="fp32", tensorboard=False)  # fmt: skip
        # questions with 1 to 3 scored passages: "mean" weighs pairs, not questions
        train = distillation_examples(examples, 3, "reader_score", "scored.json")
        train = [first_passages(e, 1 + i % 3) for i, e in enumerate(train)]
        task = RetrieverTask(model, tokenizer, cfg, train, [], CPU)
        union = _union_gradients(model, task, sum(UNEVEN, []))
        model.zero_grad()
        accumulate_gradients(task, model, UNEVEN, 1, CPU, contextlib.nullcontext(), None,
                             lambda last: contextlib.nullcontext())  # fmt: skip
        # the student's logits are fp32 (distillation_loss): fp32 round-off, not float64's
        assert _close_in_scale(_gradients(model), union, rtol=1e-5), reduction
        model.zero_grad()
        for batch in UNEVEN:
            (task.loss(model, batch) / len(UNEVEN)).backward()
        assert not _close_in_scale(_gradients(model), union, rtol=1e-5), reduction


def first_passages(example, n):
    """A distillation example cut to its first n passages."""
    flags = None if example.has_answer is None else example.has_answer[:n]
    return dataclasses.replace(example, titles=example.titles[:n], texts=example.texts[:n],
                               teacher=example.teacher[:n], has_answer=flags)  # fmt: skip


# One rank of a 2-rank data-parallel step (fid.training.replicas): its micro-batches,
# weighted by loss_weights (whose count all-reduce spans the ranks), then rank 0 writes the
# averaged gradients.
_RANK = """
import contextlib, json, sys
import torch
from fid.config import ReaderTrainConfig
from fid.data.examples import load_examples
from fid.models.loading import load_reader
from fid.runtime import distributed
from fid.training import replicas
from fid.training.accumulation import accumulate_gradients
from fid.training.reader import ReaderTask

model_dir, train, out, shares = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
device = distributed.setup(distributed.init_from_env())
rank, world = distributed.world()
reader, tokenizer = load_reader(model_dir, 2, True, dropout=0.0)
reader = reader.double().train()
task = ReaderTask(reader, tokenizer, ReaderTrainConfig(**json.loads(sys.argv[5])),
                  load_examples(train), [], device)
replicas.broadcast_weights(reader)  # as run_training: local backwards, then one average
accumulate_gradients(task, reader, [(0, b) for b in shares[rank]], world, device,
                     contextlib.nullcontext(), None, lambda last: contextlib.nullcontext())
replicas.average_gradients([p for p in reader.parameters() if p.requires_grad])
if rank == 0:
    torch.save({n: p.grad for n, p in reader.named_parameters() if p.grad is not None}, out)
distributed.cleanup()
"""


def test_two_ranks_with_uneven_shares_give_the_gradient_of_the_union(
    tmp_path, tiny_model_dir, toy_records
):
    train = _train_file(tmp_path, toy_records)
    # rank 0: 4 questions in micro-batches of 3 and 1; rank 1: 6 in micro-batches of 2 and 4
    shares = [[UNEVEN[0], UNEVEN[1]], [UNEVEN[3], UNEVEN[2]]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _RANK,
                str(tiny_model_dir),
                str(train),
                str(tmp_path / "grads.pt"),
                json.dumps(shares),
                json.dumps(READER),
            ],
            env=dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE="2",
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                OMP_NUM_THREADS="1",
            ),
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    for rank in ranks:
        _, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err[-3000:]
    reader, task = _reader_task(tiny_model_dir, train)
    union = _union_gradients(reader, task, (0, sum(UNEVEN, [])))
    assert _close(torch.load(tmp_path / "grads.pt"), union)
