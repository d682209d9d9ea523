"""Golden outputs of the ORIGINAL facebookresearch/FiD code (tests/golden/, README there):
tiny models in the original's key layouts go through fid's own import paths (`fid
convert-checkpoint`, the released-retriever import) and must reproduce the original's losses,
logits, greedy answers, passage scores, embeddings, KL loss, gradients and one optimiser step,
in fp32, within the tolerances that README states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import T5ForConditionalGeneration

from fid.cli import main
from fid.models import loading
from fid.models.convert import released_retriever
from fid.models.reader import FiDReader
from fid.models.retriever import DualEncoder
from fid.training.optim import build_optimizer
from fid.training.retriever import distillation_loss

GOLDEN = Path(__file__).resolve().parent / "golden"
READER, RETRIEVER = GOLDEN / "reader", GOLDEN / "retriever"
CASES = ("N1", "N3", "N7")


def _json(path: Path):
    return json.loads(path.read_text())


def _convert_reader(tmp: Path, *flags: str) -> Path:
    """The original's trained tiny FiDT5 as the released readers come (pytorch_model.bin +
    config.json of transformers 3.0.2), imported by `fid convert-checkpoint`."""
    released = tmp / "released"
    released.mkdir()
    torch.save(load_file(READER / "model.safetensors"), released / "pytorch_model.bin")
    shutil.copy(READER / "config.json", released / "config.json")
    args = ["convert-checkpoint", "--checkpoint", str(released), "--output", str(tmp / "reader")]
    assert main([*args, *flags]) == 0
    return tmp / "reader"


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    """Imported with the original's cross-attention bias, loaded by fid's loading."""
    folder = _convert_reader(
        tmp_path_factory.mktemp("golden_reader"), "--keep-cross-attention-bias"
    )
    # the fixtures' tokenizer is word-level and not saved: fid's loading without the tokenizer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
        reader, _ = loading.load_reader(str(folder), 3, pack_passages=True)
    assert not reader.pack_passages  # positions matter to the bias
    return reader.eval()


@pytest.fixture(scope="module")
def reader_without_bias(tmp_path_factory):
    """The default import: the bias dropped (fid.models.convert), decoder tokens packed."""
    folder = _convert_reader(tmp_path_factory.mktemp("golden_reader_packed"))
    return FiDReader(T5ForConditionalGeneration.from_pretrained(folder), encoder_buckets=3).eval()


def _case(name):
    case = _json(READER / "inputs.json")["cases"][name]
    ids = torch.tensor(case["input_ids"])  # (4, N, 48)
    mask = torch.tensor(case["attention_mask"]).long()
    return ids, mask, torch.tensor(case["labels"])  # labels (4, 12), -100 padded


@pytest.mark.parametrize("name", CASES)
def test_reader_loss_and_logits_equal_the_original(reader, name):
    expected = _json(READER / "expected.json")["cases"][name]
    ids, mask, labels = _case(name)
    with torch.no_grad():
        out = reader(ids, mask, labels=labels)
    assert abs(out.loss.item() - expected["loss"]) <= 1e-5 * abs(expected["loss"])
    golden = load_file(READER / "logits.safetensors")[name]  # (4, 12, 1000)
    torch.testing.assert_close(out.logits, golden, rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("name", CASES)
def test_reader_greedy_answers_equal_the_original(reader, name):
    expected = _json(READER / "expected.json")["cases"][name]["greedy_ids"]
    ids, mask, _ = _case(name)
    generated = reader.generate(ids, mask, max_new_tokens=9)  # the original's max_length=10
    for row, want in zip(generated.tolist(), expected, strict=True):
        # the original pads finished rows with 0 to its longest row: compare up to EOS
        assert row[: row.index(1) + 1] == want[: want.index(1) + 1]


@pytest.mark.parametrize("name", CASES)
def test_reader_passage_scores_equal_the_original(reader, reader_without_bias, name):
    """With the bias kept: the original's scores. Dropped (the default import): the original's
    minus one model-wide constant, the bias's bucket-0 mean over heads (fid.models.convert)."""
    golden = _json(READER / "expected.json")
    case = golden["cases"][name]
    ids, mask, _ = _case(name)
    scores = reader.passage_scores(ids, mask, "mean_logit")
    want = torch.tensor(case["crossattention_scores"])
    torch.testing.assert_close(scores, want, rtol=0, atol=1e-5)
    without = reader_without_bias.passage_scores(ids, mask, "mean_logit")
    torch.testing.assert_close(
        without, torch.tensor(case["crossattention_scores_zero_xbias"]), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(
        without + golden["xbias_bucket0_mean_over_heads"], want, rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("name", CASES)
def test_the_default_import_gives_the_originals_answers(reader_without_bias, name):
    """Without the bias the loss moves by < 2e-5 relative and greedy answers are the same."""
    expected = _json(READER / "expected.json")["cases"][name]
    ids, mask, labels = _case(name)
    with torch.no_grad():
        loss = reader_without_bias(ids, mask, labels=labels).loss.item()
    assert abs(loss - expected["loss"]) <= 2e-5 * expected["loss"]
    generated = reader_without_bias.generate(ids, mask, max_new_tokens=9).tolist()
    for row, want in zip(generated, expected["greedy_ids"], strict=True):
        assert row[: row.index(1) + 1] == want[: want.index(1) + 1]


def _retriever() -> DualEncoder:
    config = _json(RETRIEVER / "config.json")["retriever_config"]
    return released_retriever(load_file(RETRIEVER / "model.safetensors"), config, "golden").eval()


def _retriever_batch():
    inputs = _json(RETRIEVER / "inputs.json")
    question_ids = torch.tensor(inputs["question_ids"])  # (4, 24)
    question_mask = torch.tensor(inputs["question_mask"]).long()
    passage_ids = torch.tensor(inputs["passage_ids"]).flatten(0, 1)  # (4 * 5, 48)
    passage_mask = torch.tensor(inputs["passage_mask"]).long().flatten(0, 1)
    teacher = torch.tensor(inputs["gold_scores"])  # (4, 5), sorted by the reader's score
    return question_ids, question_mask, passage_ids, passage_mask, teacher


def test_retriever_embeddings_and_scores_equal_the_original():
    model = _retriever()
    assert model.spec.input_format == "fid" and model.spec.project_tokens
    expected = _json(RETRIEVER / "expected.json")
    q_ids, q_mask, p_ids, p_mask, _ = _retriever_batch()
    with torch.no_grad():
        q, p = model(q_ids, q_mask, p_ids, p_mask)
    torch.testing.assert_close(q, torch.tensor(expected["question_embeddings"]), rtol=0, atol=1e-5)
    p = p.view(4, 5, -1)
    torch.testing.assert_close(p, torch.tensor(expected["passage_embeddings"]), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        model.scores(q, p), torch.tensor(expected["scores"]), rtol=0, atol=1e-5
    )


def test_retriever_inputs_are_the_originals_strings():
    """The original's retriever inputs, built by fid's RetrieverTokenizer in format "fid"."""
    from fid.models.retriever import RetrieverTokenizer

    inputs = _json(RETRIEVER / "inputs.json")
    encode = RetrieverTokenizer(None, 24, 48, "fid")
    questions = [e["question"] for e in inputs["examples"]]
    assert encode.question_texts(questions) == inputs["question_strings"]
    by_id = {c["id"]: c for e in inputs["examples"] for c in e["ctxs_unsorted"]}
    for used, strings in zip(inputs["used_ctx_ids"], inputs["passage_strings"], strict=True):
        titles = [by_id[i]["title"] for i in used]
        texts = [by_id[i]["text"] for i in used]
        built, _ = encode._passage_inputs(titles, texts)
        assert built[0] == strings


def test_one_distillation_step_equals_the_original():
    """KL loss ('mean' reduction), its gradients, and one AdamW step with the original's
    set-up (decay on every parameter, lr 1e-4, weight decay 0.1, clip 1.0, fixed lr)."""
    model = _retriever().train()
    expected = _json(RETRIEVER / "expected.json")
    q_ids, q_mask, p_ids, p_mask, teacher = _retriever_batch()
    q, p = model(q_ids, q_mask, p_ids, p_mask)
    owner = torch.arange(4).repeat_interleave(5)
    loss = distillation_loss(q, p, owner, teacher.flatten(), 1.0, 1.0, False, "mean")
    assert abs(loss.item() - expected["kl_loss"]) <= 1e-5 * expected["kl_loss"]
    batchmean = distillation_loss(q, p, owner, teacher.flatten(), 1.0, 1.0, False, "batchmean")
    assert abs(batchmean.item() - expected["kl_loss_batchmean"]) <= 1e-5 * expected["kl_loss"] * 5
    loss.backward()

    grads = load_file(RETRIEVER / "grads.safetensors")
    named = dict(_original_names(model))
    for name, golden in grads.items():
        if name.startswith("model.pooler."):
            continue  # fid drops the pooler: the original never uses it
        torch.testing.assert_close(named[name].grad, golden, rtol=1e-4, atol=1e-7, msg=name)
    hyper = expected["one_step_hyperparameters"]
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hyper.get("clip", 1.0))
    assert abs(norm.item() - expected["grad_norm_before_clip"]) <= 1e-5 * norm.item()
    optimizer = build_optimizer(model, hyper.get("lr", 1e-4), hyper.get("weight_decay", 0.1),
                                decay_biases_and_norms=True)  # fmt: skip
    optimizer.step()
    after = load_file(RETRIEVER / "after_one_step.safetensors")
    for name, parameter in _original_names(model):
        torch.testing.assert_close(parameter.detach(), after[name], rtol=0, atol=1e-6, msg=name)


def _original_names(model: DualEncoder):
    """fid's parameters under the original's state-dict names."""
    for name, parameter in model.question_encoder.named_parameters():
        yield f"model.{name}", parameter
    for prefix, module in (("proj", model.proj), ("norm", model.norm)):
        for name, parameter in module.named_parameters():
            yield f"{prefix}.{name}", parameter


@pytest.fixture(scope="module")
def released_retriever_folder(tmp_path_factory):
    """The golden retriever as facebookresearch/FiD released its retrievers (pytorch_model.bin
    + a flat RetrieverConfig config.json), and a BERT tokenizer over the fixtures' vocabulary."""
    from transformers import BertTokenizer

    tmp = tmp_path_factory.mktemp("golden_retriever")
    released = tmp / "released"
    released.mkdir()
    torch.save(load_file(RETRIEVER / "model.safetensors"), released / "pytorch_model.bin")
    config = _json(RETRIEVER / "config.json")["retriever_config"]
    (released / "config.json").write_text(json.dumps(config))
    (tmp / "vocab").mkdir()
    vocab = _json(RETRIEVER / "inputs.json")["vocab"]
    (tmp / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer.from_pretrained(tmp / "vocab", do_lower_case=True).save_pretrained(tmp / "tok")
    return released, tmp / "tok"


def test_a_released_retriever_converted_embeds_and_retrieves_as_the_original(
    tmp_path, released_retriever_folder
):
    """`fid convert-checkpoint --kind retriever`, then embed-passages / build-index / retrieve
    on the fixtures' passages: the original's input strings, ids and embeddings, end to end."""
    released, tokenizer = released_retriever_folder
    model = tmp_path / "retriever"
    assert main(["convert-checkpoint", "--kind", "retriever", "--checkpoint", str(released),
                 "--tokenizer", str(tokenizer), "--output", str(model)]) == 0  # fmt: skip
    spec = _json(model / "dual_encoder.json")
    assert (spec["input_format"], spec["projection_dim"], spec["project_tokens"]) == (
        "fid",
        32,
        True,
    )
    assert (spec["question_max_tokens"], spec["passage_max_tokens"]) == (24, 48)

    inputs = _json(RETRIEVER / "inputs.json")
    by_id = {c["id"]: c for e in inputs["examples"] for c in e["ctxs_unsorted"]}
    used = [i for ids in inputs["used_ctx_ids"] for i in ids]  # (4 x 5) in the fixtures' order
    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\n" + "".join(
        f"{i}\t{by_id[i]['text']}\t{by_id[i]['title']}\n" for i in dict.fromkeys(used)))  # fmt: skip
    assert main(["embed-passages", "--model", str(model), "--passages", str(passages),
                 "--output", str(tmp_path / "shard0")]) == 0  # fmt: skip
    import numpy as np

    vectors = np.load(tmp_path / "shard0.npy").astype(np.float32)
    ids = np.load(tmp_path / "shard0.ids.npy").tolist()
    golden = torch.tensor(_json(RETRIEVER / "expected.json")["passage_embeddings"]).flatten(0, 1)
    ours = torch.tensor(vectors[[ids.index(i) for i in used]])
    torch.testing.assert_close(ours, golden, rtol=0, atol=2e-3)  # float16 shards

    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(
        json.dumps({"id": f"q{n}", "question": e["question"], "answer": e["answers"]}) + "\n"
        for n, e in enumerate(inputs["examples"])))  # fmt: skip
    assert main(["build-index", "--shards", str(tmp_path / "shard0"), "--output",
                 str(tmp_path / "index")]) == 0  # fmt: skip
    assert main(["retrieve", "--model", str(model), "--index", str(tmp_path / "index"),
                 "--passages", str(passages), "--questions", str(questions),
                 "--output", str(tmp_path / "retrieved.json")]) == 0  # fmt: skip
    records = _json(tmp_path / "retrieved.json")
    scores = torch.tensor(_json(RETRIEVER / "expected.json")["scores"])  # (4, 5), /sqrt(32)
    for record, own_ids, own_scores in zip(records, inputs["used_ctx_ids"], scores, strict=True):
        # the index's inner product is the original's score times sqrt(32)
        best = own_ids[int(own_scores.argmax())]
        found = {c["id"]: c["score"] for c in record["ctxs"]}
        assert abs(found[best] - float(own_scores.max()) * 32**0.5) < 2e-2
