"""A bad config stops before any job runs, with a message that names the problem."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml
from workflow_helpers import ROOT, SAMPLES, snakemake, write_config

DEMO = ROOT / "config" / "config.yaml"


def _fails(tmp_path, config, *expected):
    result = snakemake(tmp_path, "--configfile", str(config), "--cores", "1", timeout=600)
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-2000:]
    for text in expected:
        assert text in message, (text, message[-3000:])
    # nothing ran: no job output, log or state
    assert not any((tmp_path / d).exists() for d in ("results", "resources", "state", "logs"))
    return message


def test_unknown_top_level_key(tmp_path):
    config = write_config(tmp_path / "c.yaml", DEMO, roundz=3)
    _fails(tmp_path, config, "'roundz' was unexpected")


def test_unknown_nested_workflow_key(tmp_path):
    data = yaml.safe_load(DEMO.read_text())["data"]
    config = write_config(tmp_path / "c.yaml", DEMO, data={**data, "sorce": "demo"})
    _fails(tmp_path, config, "'sorce' was unexpected")


def test_unknown_stage_knob(tmp_path):
    reader = yaml.safe_load(DEMO.read_text())["reader"]
    config = write_config(tmp_path / "c.yaml", DEMO, reader={**reader, "learning_rate": 0.1})
    _fails(tmp_path, config, "config section 'reader'", "unknown key 'learning_rate'")


def test_wrong_types(tmp_path):
    config = write_config(tmp_path / "c.yaml", DEMO, rounds="two")
    _fails(tmp_path, config, "'two' is not of type 'integer'")
    retriever = yaml.safe_load(DEMO.read_text())["retriever"]
    config = write_config(tmp_path / "c.yaml", DEMO, retriever={**retriever, "lr": "fast"})
    _fails(tmp_path, config, "config section 'retriever'", "lr = 'fast' has the wrong type")


def test_zero_rounds(tmp_path):
    config = write_config(tmp_path / "c.yaml", DEMO, rounds=0)
    _fails(tmp_path, config, "0 is less than the minimum of 1")


def test_out_of_range_knob(tmp_path):
    config = write_config(tmp_path / "c.yaml", DEMO, embed_passages={"batch_size": 0})
    _fails(tmp_path, config, "batch_size = 0 is out of range")


def test_later_rounds_override_checked_as_a_whole(tmp_path):
    """later_rounds.retriever merged over `retriever`: 1 candidate leaves nothing to select on."""
    later = yaml.safe_load(DEMO.read_text())["later_rounds"]
    later["retriever"] = {**later["retriever"], "n_passages": 1}
    config = write_config(tmp_path / "c.yaml", DEMO, later_rounds=later)
    _fails(tmp_path, config, "config section 'retriever_later'", "ranks 1 of the n_passages = 1")


def test_distillation_signal_knobs_checked_where_they_are_set(tmp_path):
    """A signal's knobs are checked merged over the round's own, named by the signal; EMDR2
    needs the log-likelihoods only pdist writes; a signal that repeats the round's own teacher,
    or whose name cannot be a path component, is refused."""
    signals = {"pd": {"score_passages": {"mode": "pdst"}}}
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals=signals)
    _fails(tmp_path, config, "config section 'distillation_signals.pd.score_passages'", "pdst")
    emdr2 = {"objective": "emdr2", "reader_temperature": 1.0}  # the demo's is attention's 0.1
    signals = {"em": {"retriever": emdr2}}
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals=signals)
    _fails(tmp_path, config, "config key 'distillation_signals.em.retriever.objective'",
           "not 'attention_mass'", "set mode: pdist in distillation_signals.em.score_passages")  # fmt: skip
    retriever = yaml.safe_load(DEMO.read_text())["retriever"]
    config = write_config(tmp_path / "c.yaml", DEMO, retriever={**retriever, **emdr2})
    _fails(
        tmp_path, config, "config key 'retriever.objective'", "set mode: pdist in score_passages"
    )
    signals = {"same": {"score_passages": {"mode": "attention_mass"}}}
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals=signals)
    _fails(tmp_path, config, "config key 'distillation_signals.same'", "train iter1 again")
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals={"a/b": {}})
    _fails(tmp_path, config, "'a/b' does not match")


def test_a_signal_takes_its_modes_reader_temperature(tmp_path):
    """A number is the temperature of the round's own mode: a signal that scores in another
    does not inherit it (pdist trained silently at attention mass's 0.1, and EMDR2 stopped the
    run for it). The refusal names the signal's key, as does an inherited value the signal's
    own knobs refuse, and a per-mode mapping with a key that is no mode (issue 49 item 3)."""
    retriever = yaml.safe_load(DEMO.read_text())["retriever"]
    numbered = {**retriever, "reader_temperature": 0.1}
    signals = {"pd": {"score_passages": {"mode": "pdist"}}}
    config = write_config(tmp_path / "c.yaml", DEMO, retriever=numbered,
                          distillation_signals=signals)  # fmt: skip
    _fails(tmp_path, config,
           "config key 'distillation_signals.pd.retriever.reader_temperature': the signal scores "
           "with mode 'pdist', and retriever.reader_temperature = 0.1 is the temperature of the "
           "round's mode 'attention_mass'")  # fmt: skip
    own = {**retriever, "reader_temperature": {"pdist": 0.5}}
    signals = {"em": {"score_passages": {"mode": "pdist"}, "retriever": {"objective": "emdr2"}}}
    config = write_config(tmp_path / "c.yaml", DEMO, retriever=own, distillation_signals=signals)
    _fails(tmp_path, config, "reader_temperature = 0.5 with objective = 'emdr2'",
           "Hint: reader_temperature comes from retriever.reader_temperature: set "
           "distillation_signals.em.retriever.reader_temperature")  # fmt: skip
    bad = {**retriever, "reader_temperature": {"attention": 0.1}}
    config = write_config(tmp_path / "c.yaml", DEMO, retriever=bad)
    _fails(tmp_path, config, "config key 'retriever.reader_temperature': 'attention' is no "
           "score_passages mode")  # fmt: skip


def test_a_key_given_twice_names_both_lines(tmp_path):
    """Snakemake's loader keeps the last of two keys: a signal named twice ran the second's
    mode. The workflow refuses the file, naming the key and both lines."""
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals={})
    text = config.read_text().replace(
        "distillation_signals: {}",
        "distillation_signals:\n  pd:\n    score_passages: {mode: pdist}\n"
        "  pd:\n    score_passages: {mode: loop}",
    )
    config.write_text(text)
    lines = text.splitlines()
    first = lines.index("  pd:") + 1
    _fails(tmp_path, config, "key 'pd' is given twice", f"(line {first} and line {first + 2})")


def test_two_signals_with_the_same_knobs(tmp_path):
    """Both would be scored, trained, embedded and indexed: twice the work for one row."""
    signals = {"pdist": {"score_passages": {"mode": "pdist"}},
               "pdist_again": {"score_passages": {"mode": "pdist"}}}  # fmt: skip
    config = write_config(tmp_path / "c.yaml", DEMO, distillation_signals=signals)
    _fails(tmp_path, config, "config key 'distillation_signals.pdist_again'",
           "its knobs are those of distillation_signals.pdist")  # fmt: skip


def test_srun_job_with_one_task_per_node(tmp_path):
    """snakemake-executor-plugin-slurm refuses it at submission, after other jobs ran."""
    nq = yaml.safe_load((ROOT / "config" / "nq.yaml").read_text())
    nq["resources"]["train_reader"]["tasks_per_node"] = 1
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(nq))
    _fails(tmp_path, tmp_path / "c.yaml", "config key 'resources.train_reader.tasks_per_node'")


def test_download_without_checksum_needs_a_reason(tmp_path):
    nq = yaml.safe_load((ROOT / "config" / "nq.yaml").read_text())
    del nq["data"]["downloads"]["dataindex.tar.gz"]["no_checksum_because"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(nq))
    _fails(tmp_path, tmp_path / "c.yaml", "'no_checksum_because' is a required property")


def test_missing_data_file(tmp_path):
    own = yaml.safe_load((ROOT / "config" / "own_data.yaml").read_text())
    (tmp_path / "data" / "own").mkdir(parents=True)
    shutil.copy(SAMPLES / "squad-open-tiny" / "psgs_w100.tsv", tmp_path / "data" / "own")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(own))
    result = snakemake(tmp_path, "--configfile", str(config), "--cores", "1")
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"config key 'data\.questions\.(train|dev|test)\.input'", message)
    assert "data/own/questions.jsonl does not exist" in message
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def test_non_finite_knob(tmp_path):
    """YAML's .nan passes every range check by comparison; it is refused at DAG time."""
    reader = yaml.safe_load(DEMO.read_text())["reader"]
    config = write_config(tmp_path / "c.yaml", DEMO, reader={**reader, "lr": float("nan")})
    assert "lr: .nan" in config.read_text()
    result = snakemake(tmp_path, "-n", "--configfile", str(config))  # a plan, even if accepted
    message = result.stdout + result.stderr
    assert result.returncode != 0, message[-2000:]
    assert "config section 'reader': lr = nan is not a finite number" in message, message[-2000:]


def test_bad_accelerated_evaluations(tmp_path):
    # each entry is EvalReaderConfig's knobs over eval_reader, checked before any job runs
    config = write_config(
        tmp_path / "c.yaml", DEMO, eval_reader_accelerations={"t": {"keep_tokens": 0}}
    )
    _fails(tmp_path, config, "config section 'eval_reader_accelerations.t'", "keep_tokens = 0")
    config = write_config(
        tmp_path / "c.yaml", DEMO, eval_reader_accelerations={"p": {"num_beams": 1}}
    )
    _fails(tmp_path, config, "'eval_reader_accelerations.p'", "sets neither keep_passages nor")
    config = write_config(
        tmp_path / "c.yaml", DEMO, eval_reader_accelerations={"$(x)": {"keep_passages": 2}}
    )
    _fails(tmp_path, config, "'$(x)' does not match")


@pytest.mark.parametrize("rescoring", [{"rerank": True}, {"refine_residual": "PQ8"}])
def test_a_shortlist_shorter_than_top_k_stops_before_the_index_is_built(tmp_path, rescoring):
    index = {"factory": "IVF4,PQ4", "shortlist": 10, **rescoring}
    config = write_config(tmp_path / "c.yaml", DEMO, build_index=index)  # retrieve.top_k: 20
    _fails(tmp_path, config, "config key 'build_index.shortlist'", "retrieve.top_k = 20")


def test_a_bad_residual_refinement_stops_before_anything_runs(tmp_path):
    index = {"factory": "IVF4,PQ4", "refine_residual": "SQ8"}
    config = write_config(tmp_path / "c.yaml", DEMO, build_index=index)
    _fails(tmp_path, config, "refine_residual = 'SQ8' is not allowed", "'PQ<M>' or 'PQ<M>x<bits>'")


_SLURM_MISTAKES = {
    "tasks per node vs GPUs": (
        "train_reader", {"tasks_per_node": 4},
        ["config key 'resources.train_reader.tasks_per_node'", "4 ranks per node for 8 GPUs"],
    ),
    "GPU type with a dash": (
        "train_reader", {"gres": "gpu:nvidia_a100-sxm4-80gb:8"},
        ["gpu:nvidia_a100-sxm4-80gb:8", "does not match"],
    ),
    "QoS in slurm_extra": (
        "train_reader", {"slurm_extra": "--qos=long"},
        ["config key 'resources.train_reader.slurm_extra'", "quality of service"],
    ),
    "a signal in slurm_extra": (
        "train_reader", {"slurm_extra": "--signal=USR1@60"},
        ["config key 'resources.train_reader.slurm_extra'", "--signal has its own key"],
    ),
    "a signal for a job that does not train": (
        "score_passages", {"signal_lead_s": 300},
        ["config key 'resources.score_passages.signal_lead_s'", "only training jobs"],
    ),
    "a lead longer than the job": (
        "train_reader", {"runtime": 5, "signal_lead_s": 600},
        ["config key 'resources.train_reader.signal_lead_s'", "comes before it starts"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("mistake", list(_SLURM_MISTAKES))
def test_slurm_keys_are_checked_before_any_job(tmp_path, mistake):
    """What the SLURM plugin would refuse at a submission (after other jobs ran), or what would
    run badly on the cluster, is refused when the config is read, naming the key."""
    rule, change, expected = _SLURM_MISTAKES[mistake]
    nq = yaml.safe_load((ROOT / "config" / "nq.yaml").read_text())
    nq["resources"][rule].update(change)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(nq))
    _fails(tmp_path, tmp_path / "c.yaml", *expected)


def test_a_stop_signal_needs_srun_ranks(tmp_path):
    """The demo's training jobs are local ranks under one Snakemake job step: a signal to the
    job's steps would reach Snakemake first, so the key is refused there."""
    resources = yaml.safe_load(DEMO.read_text())["resources"]
    resources["train_retriever"] = {**resources["train_retriever"], "signal_lead_s": 300}
    config = write_config(tmp_path / "c.yaml", DEMO, resources=resources)
    _fails(tmp_path, config, "resources.train_retriever.signal_lead_s", "srun tasks")
