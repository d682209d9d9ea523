"""fid loads pretrained models without transformers' hub kernels (fid.models.pretrained): by
default `from_pretrained` swaps layers for kernels downloaded from the Hub at load time, which
failed on an offline H200 node for BERT (2026-12-04) and changes the code the model runs."""

from __future__ import annotations

import re
from pathlib import Path

from fid.config import InitRetrieverConfig
from fid.demo.tiny_models import build_tiny_bert
from fid.models.loading import load_t5
from fid.models.retriever import _load_encoder

ROOT = Path(__file__).resolve().parents[1]


def test_the_reader_loads_without_hub_kernels(tiny_model_dir):
    assert load_t5(str(tiny_model_dir)).use_kernels is False


def test_the_retriever_encoder_loads_without_hub_kernels(tmp_path):
    config = InitRetrieverConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    build_tiny_bert(config, vocab_size=50).save_pretrained(tmp_path)
    assert _load_encoder(tmp_path).use_kernels is False


def test_no_model_is_loaded_around_load_pretrained():
    """A model class's from_pretrained anywhere but fid/models/pretrained.py would bring the
    kernels back (configs and tokenizers load no layers; DualEncoder.from_pretrained is fid's own,
    through `_load_encoder`)."""
    allowed = re.compile(r"(AutoConfig|\w*Tokenizer\w*|Config|DualEncoder)\.from_pretrained\(")
    found = []
    for path in [*ROOT.glob("fid/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]:
        if path.name == "pretrained.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ".from_pretrained(" in line and not allowed.search(line) and "def " not in line:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_a_half_precision_folder_loads_as_fp32_master_weights(tmp_path, tiny_model_dir):
    """transformers 5 loads a folder in its saved dtype: a bf16 folder gave bf16 weights on the
    unsharded path (FSDP built fp32), so the two trained different models (issue 43, item 5)."""
    import torch

    t5 = load_t5(str(tiny_model_dir))
    t5.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert {p.dtype for p in load_t5(str(tmp_path / "bf16")).parameters()} == {torch.float32}
    config = InitRetrieverConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    build_tiny_bert(config, vocab_size=50).to(torch.float16).save_pretrained(tmp_path / "fp16")
    assert {p.dtype for p in _load_encoder(tmp_path / "fp16").parameters()} == {torch.float32}
