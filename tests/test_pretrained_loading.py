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
    for path in [*ROOT.glob("fid/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if path.name == "pretrained.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ".from_pretrained(" in line and not allowed.search(line) and "def " not in line:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
