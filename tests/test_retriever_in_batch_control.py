"""train_n_passages (issue 49.1): the in-batch control with no candidates. A training question
keeps its first train_n_passages passages by teacher score (under uniform scores: its list's
top passage); with one, the loss is DPR's in-batch cross-entropy; dev questions still rank all
n_passages candidates."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import scored_retriever_inputs, write_json

import fid.training.retriever as retriever_training
from fid.config import ConfigError, RetrieverTrainConfig


def _cfg(**overrides) -> RetrieverTrainConfig:
    knobs = dict(n_passages=4, train_n_passages=1, in_batch_negatives=True, eval_k=[1],
                 select_on="candidate_answer_recall@1", precision="fp32", max_steps=1,
                 batch_size_per_device=4, question_max_tokens=16, passage_max_tokens=32,
                 retriever_temperature=0.5, tensorboard=False)  # fmt: skip
    return RetrieverTrainConfig(**{**knobs, **overrides})


@pytest.fixture(scope="module")
def task(tmp_path_factory, toy_records):
    """The RetrieverTask train_retriever builds on uniform scores (every reader_score 0), not
    trained: train_and_export is replaced by one that hands the task back."""
    root = tmp_path_factory.mktemp("in_batch")
    train, dev, bert = scored_retriever_inputs(root, toy_records, 6, 3, 4)
    for path in (train, dev):
        records = json.loads(path.read_text())
        for record in records:
            for ctx in record["ctxs"]:
                ctx["reader_score"] = 0.0
        write_json(path, records)
    captured = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retriever_training, "train_and_export",
                      lambda task, *args, **kwargs: captured.setdefault("task", task))  # fmt: skip
        retriever_training.train_retriever(_cfg(), train, dev, str(bert), root / "out",
                                           root / "state", torch.device("cpu"))  # fmt: skip
    captured["records"] = json.loads(train.read_text())
    return captured


def test_a_training_question_keeps_its_lists_top_passage_and_dev_ranks_all(task):
    built, records = task["task"], task["records"]
    assert [e.texts for e in built.train] == [[r["ctxs"][0]["text"]] for r in records]
    assert all(len(e.texts) == 4 for e in built.dev)


def test_one_passage_a_question_is_dprs_in_batch_cross_entropy(task):
    """loss = mean over questions of -log softmax_j(q_i . p_j / sqrt(D) / T)[i]: each question's
    one positive against the batch's other questions' positives."""
    built = task["task"]
    torch.manual_seed(0)
    indices = [0, 1, 2, 3]
    with torch.no_grad():
        loss = built.loss(built.model, indices)
        q, p = built._embed(built.model, [built.train[i] for i in indices])  # (4, D), (4, D)
        logits = q.double() @ p.double().T / q.shape[1] ** 0.5 / 0.5  # (4, 4)
        expected = torch.nn.functional.cross_entropy(logits, torch.arange(4))
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


def test_train_n_passages_is_checked():
    with pytest.raises(ConfigError, match="train_n_passages = 1 without in_batch_negatives"):
        _cfg(in_batch_negatives=False)
    with pytest.raises(ConfigError, match=r"train_n_passages = 5 is out of range: expected >= 1 "
                                          r"and <= 4"):  # fmt: skip
        _cfg(train_n_passages=5)
    assert _cfg(train_n_passages=None).train_n_passages is None
