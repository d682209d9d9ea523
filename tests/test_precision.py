"""fid.runtime.precision: "auto" is bf16 on a GPU and fp32 on a CPU; bf16 on a CPU that lacks
native bf16 matrix products is allowed, with a warning (measured several times slower)."""

from __future__ import annotations

import logging

import pytest
import torch

from fid.runtime import precision
from fid.runtime.precision import autocast, resolve_precision


def test_auto_means_fp32_on_a_cpu_and_bf16_on_a_gpu():
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
