"""fid.runtime.precision: "auto" is bf16 on a GPU and fp32 on a CPU, but for the inference of a
model wide enough on a CPU with native bf16; bf16 on a CPU that lacks native bf16 matrix
products is allowed, with a warning (measured several times slower). The commands record what
they chose."""

from __future__ import annotations

import logging

import pytest
import torch

from fid.runtime import precision
from fid.runtime.precision import autocast, resolve_precision


def test_auto_means_fp32_on_a_cpu_and_bf16_on_a_gpu(monkeypatch):
    monkeypatch.setattr(precision, "cuda_computes_bf16", lambda device: True)
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ValueError, match="expected one of"):
        resolve_precision("fp8", torch.device("cpu"))


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_warns_only_without_native_bf16(monkeypatch, caplog, native):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    precision._warn_slow_bf16.cache_clear()
    with caplog.at_level(logging.WARNING), autocast(torch.device("cpu"), "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert ("without native bf16" in caplog.text) is not native
    with autocast(torch.device("cpu"), "auto"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        autocast(torch.device("cpu"), "fp16")


@pytest.mark.parametrize("native", [True, False])
def test_auto_inference_on_a_cpu_is_bf16_where_it_pays(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    monkeypatch.setattr(precision, "cuda_computes_bf16", lambda device: True)
    cpu, wide = torch.device("cpu"), precision.CPU_BF16_MIN_WIDTH
    assert resolve_precision("auto", cpu, inference_width=wide) == ("bf16" if native else "fp32")
    assert resolve_precision("auto", cpu, inference_width=wide - 1) == "fp32"  # too narrow
    assert resolve_precision("auto", cpu) == "fp32"  # training, teacher scores
    assert resolve_precision("fp32", cpu, inference_width=wide) == "fp32"  # asked for
    assert resolve_precision("auto", torch.device("cuda"), inference_width=8) == "bf16"


def test_commands_record_the_precision_they_chose(
    tmp_path, tiny_model_dir, toy_records, monkeypatch
):
    """eval-reader's metrics and embed-passages' shard record the resolved precision: fp32 for
    a narrow model, bf16 where the CPU computes it and the model is wide enough."""
    import json

    from conftest import write_json

    from fid.cli import main

    questions = write_json(tmp_path / "q.json", toy_records["dev"][:3])
    for native, width, want in ((True, 10**6, "fp32"), (True, 8, "bf16"), (False, 8, "fp32")):
        monkeypatch.setattr(precision, "cpu_computes_bf16", lambda native=native: native)
        monkeypatch.setattr(precision, "CPU_BF16_MIN_WIDTH", width)
        metrics = tmp_path / f"m{width}{native}.json"
        assert main(["eval-reader", "--model", str(tiny_model_dir), "--questions", str(questions),
                     "--predictions", str(tmp_path / "p.jsonl"), "--metrics", str(metrics)]) == 0  # fmt: skip
        assert json.loads(metrics.read_text())["generation"]["precision"] == want

    from fid.config import InitRetrieverConfig
    from fid.demo.tiny_models import init_retriever

    init_retriever(InitRetrieverConfig(vocab_size=200, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=32), [questions], tmp_path / "bert")  # fmt: skip
    ctxs = {c["id"]: c for r in toy_records["dev"][:3] for c in r["ctxs"]}
    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\n" + "".join(
        f"{c['id']}\t{c['text']}\t{c['title']}\n" for c in ctxs.values()))  # fmt: skip
    for native, width, want in ((True, 10**6, "fp32"), (True, 8, "bf16")):
        monkeypatch.setattr(precision, "cpu_computes_bf16", lambda native=native: native)
        monkeypatch.setattr(precision, "CPU_BF16_MIN_WIDTH", width)
        shard = tmp_path / f"shard{width}"
        assert main(["embed-passages", "--model", str(tmp_path / "bert"), "--passages",
                     str(passages), "--output", str(shard)]) == 0  # fmt: skip
        assert json.loads((tmp_path / f"shard{width}.json").read_text())["precision"] == want


def test_auto_on_a_gpu_before_ampere_is_fp32_and_says_so(monkeypatch, caplog):
    """A V100 or T4 has no bf16 arithmetic (emulated: slow): auto was bf16 on every GPU."""
    precision.cuda_computes_bf16.cache_clear()
    seen = []

    def supported(including_emulation=True):
        seen.append(including_emulation)
        return including_emulation  # only emulated

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    with caplog.at_level(logging.WARNING):
        assert resolve_precision("auto", torch.device("cuda")) == "fp32"
    assert seen == [False] and "Tesla V100-SXM2-32GB has no bf16 arithmetic" in caplog.text
    precision.cuda_computes_bf16.cache_clear()
