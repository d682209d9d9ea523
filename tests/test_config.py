"""Typed configs: unknown keys, wrong types and out-of-range values are rejected clearly."""

import dataclasses
import math
import typing

import pytest

from fid.config import (
    BM25Config,
    ConfigError,
    DemoDataConfig,
    DownloadConfig,
    EmbedPassagesConfig,
    EvalReaderConfig,
    EvalRetrievalConfig,
    IndexConfig,
    InitReaderConfig,
    InitRetrieverConfig,
    PrepareQuestionsConfig,
    ReaderListsConfig,
    ReaderTrainConfig,
    RetrieveConfig,
    RetrieverTrainConfig,
    ScorePassagesConfig,
    config_from_dict,
    load_config,
    reader_temperature_for,
)


def test_defaults_and_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("n_passages: 5\nlr: 1\nscheduler: cosine\nclip_grad_norm: null\n")
    cfg = load_config(path, ReaderTrainConfig)
    assert cfg.n_passages == 5 and cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.scheduler == "cosine" and cfg.clip_grad_norm is None
    assert load_config(None, ScorePassagesConfig).mode == "mean_logit"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"n_pasages": 5}, "unknown key 'n_pasages'"),
        ({"n_passages": -3}, "n_passages = -3 is out of range: expected >= 1"),
        ({"n_passages": "ten"}, "n_passages = 'ten' has the wrong type: expected int"),
        ({"n_passages": 2.5}, "expected int"),
        ({"activation_checkpointing": "yes"}, "expected bool"),
        ({"scheduler": "step"}, "one of 'constant', 'linear', 'cosine'"),
        ({"precision": "fp8"}, "precision = 'fp8'"),
        ({"lr": 0}, "lr = 0"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps = 0"),
        ({"dropout": 1.5}, "dropout = 1.5 is out of range"),
    ],
)
def test_bad_values_name_key_value_and_allowed(data, message):
    with pytest.raises(ConfigError, match="cfg.yaml") as error:
        config_from_dict(data, ReaderTrainConfig, source="cfg.yaml")
    assert message in str(error.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"objective": "emdr2", "reader_temperature": 2.0},
         "reader_temperature = 2.0 with objective = 'emdr2'"),
        ({"objective": "emdr2", "kl_reduction": "mean"},
         "kl_reduction = 'mean' with objective = 'emdr2'"),
        ({"objective": "em"}, "objective = 'em'"),
    ],
)  # fmt: skip
def test_emdr2_knobs_that_mean_nothing_are_refused(data, message):
    with pytest.raises(ConfigError, match="cfg.yaml") as error:
        config_from_dict(data, RetrieverTrainConfig, source="cfg.yaml")
    assert message in str(error.value)


def test_the_workflows_reader_temperature_per_score_mode():
    """A mapping gives each mode its number, and a mode it does not name none (the dataclass's
    1.0); a number is the section's own. Bad keys and values are refused, named."""
    per_mode = {"attention_mass": 0.1, "loop": 2}
    assert reader_temperature_for(per_mode, "attention_mass") == 0.1
    assert reader_temperature_for(per_mode, "loop") == 2
    assert reader_temperature_for(per_mode, "pdist") is None
    assert reader_temperature_for(0.5, "pdist") == 0.5
    for bad, message in [
        ({"pdst": 0.1}, "'pdst' is no score_passages mode: expected a number, or a mapping "
                        "from modes (mean_logit, attention_mass, pdist, loop, uniform) to numbers"),
        ({"pdist": "sharp"}, "pdist = 'sharp' has the wrong type: expected a number"),
        ({"pdist": True}, "pdist = True has the wrong type: expected a number"),
        ({"loop": 0}, "loop = 0 is out of range: expected >= 1e-06"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as error:
            reader_temperature_for(bad, "pdist")
        assert str(error.value) == message


def test_retriever_selection_rank_below_the_candidate_count():
    """Dev questions rank their own n_passages candidates: selecting on a rank that covers all
    of them would pick best_dev on a metric that no model can change."""
    data = {"n_passages": 5, "eval_k": [1, 5], "select_on": "candidate_answer_recall@5"}
    with pytest.raises(ConfigError, match="cfg.yaml") as error:
        config_from_dict(data, RetrieverTrainConfig, source="cfg.yaml")
    message = "select_on = 'candidate_answer_recall@5' ranks 5 of the n_passages = 5"
    assert message in str(error.value)
    cfg = config_from_dict({**data, "select_on": "candidate_answer_recall@1"}, RetrieverTrainConfig)
    assert cfg.eval_k == [1, 5]  # reporting the candidates' ceiling at k = 5 stays allowed


@pytest.mark.parametrize("old", ["answer_recall@1", "agreement@5"])
def test_retriever_selection_old_metric_names_say_the_new_ones(old):
    """The dev metrics re-rank each question's candidates; their names say so, so that they
    are not read as full-corpus top-k accuracy (the report shows both)."""
    with pytest.raises(ConfigError, match="cfg.yaml") as error:
        config_from_dict({"select_on": old}, RetrieverTrainConfig, source="cfg.yaml")
    assert f"select_on = '{old}' was renamed: use 'candidate_{old}'" in str(error.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", EvalReaderConfig)
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_passages: [1\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad, EvalReaderConfig)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(listing, EvalReaderConfig)


def test_every_field_has_a_default():
    for cls in (ReaderTrainConfig, EvalReaderConfig, ScorePassagesConfig):
        for field in dataclasses.fields(cls):
            has_default = field.default is not dataclasses.MISSING
            assert has_default or field.default_factory is not dataclasses.MISSING, field.name


def _float_knobs():
    """(dataclass, field) of every float knob of every stage config (the ones common.smk
    checks at DAG time), so that a new float knob is covered without editing this test."""
    classes = [BM25Config, DemoDataConfig, DownloadConfig, EmbedPassagesConfig]
    classes += [EvalReaderConfig, EvalRetrievalConfig, IndexConfig, InitReaderConfig]
    classes += [InitRetrieverConfig, PrepareQuestionsConfig, ReaderListsConfig]
    classes += [ReaderTrainConfig, RetrieveConfig, RetrieverTrainConfig, ScorePassagesConfig]
    for cls in classes:
        for name, hint in typing.get_type_hints(cls).items():
            if float in (hint, *typing.get_args(hint)):
                yield pytest.param(cls, name, id=f"{cls.__name__}.{name}")


@pytest.mark.parametrize("cls, key", list(_float_knobs()))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_float_knobs_are_rejected(cls, key, value):
    """NaN passes every comparison (`nan < 0` is False) and inf passes a lower bound: both
    reached torch (`lr: .nan`) before they were refused."""
    with pytest.raises(ConfigError, match="cfg.yaml") as error:
        config_from_dict({key: value}, cls, source="cfg.yaml")
    assert f"{key} = {value!r} is not a finite number" in str(error.value)


def test_non_finite_yaml_values_are_rejected(tmp_path):
    """YAML spells them .nan, .inf and -.inf; range checks also refuse them on direct use."""
    path = tmp_path / "c.yaml"
    for text in ("lr: .nan", "weight_decay: .inf", "clip_grad_norm: -.inf"):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=f"{text.split(':')[0]} = .* is not a finite"):
            load_config(path, ReaderTrainConfig)
    with pytest.raises(ConfigError, match="lr = nan is not a finite number"):
        ReaderTrainConfig(lr=math.nan)


def test_fp16_with_fsdp_is_refused_naming_why():
    """GradScaler cannot unscale sharded (DTensor) and replicated gradients together: the pair
    is refused when the config is read, not at the first optimizer step on the GPUs."""
    from fid.config import ConfigError, ReaderTrainConfig

    with pytest.raises(ConfigError, match=r"fp16.*fsdp' is refused.*mixed DTensor.*bf16"):
        ReaderTrainConfig(precision="fp16", sharding="fsdp")
    ReaderTrainConfig(precision="bf16", sharding="fsdp")
    ReaderTrainConfig(precision="fp16", sharding="ddp")
