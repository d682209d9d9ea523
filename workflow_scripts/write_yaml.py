"""Writes a mapping handed over by Snakemake (`params.section`) as a YAML file: a stage's knobs
for its `fid` subcommand (rule stage_config) or the whole config for the report."""

from pathlib import Path

import yaml

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
output = Path(snakemake.output[0])
output.parent.mkdir(parents=True, exist_ok=True)
output.write_text(yaml.safe_dump(dict(snakemake.params.section), sort_keys=False))
