"""The configuration a run used (workflow keys and every stage section), as config.yaml and as
the report's page showing it inline."""

import json
from pathlib import Path

import yaml
from report_page import write_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
output = snakemake.output
section = dict(snakemake.params.section)
# the hub models as fetched: what `models` named, at the commit each resolved to
records = [json.loads((Path(f) / "fetched.json").read_text()) for f in snakemake.input.fetched]
if records:
    section["fetched_models"] = {r["name"]: {k: r[k] for k in ("revision", "commit", "source")}
                                 for r in records}  # fmt: skip
text = yaml.safe_dump(section, sort_keys=False)
Path(output.config).write_text(text)
write_page(output.page, "Configuration", [
    "The configuration this run used: workflow keys and every stage section, each stage's keys "
    "the fields of its fid dataclass (config/README.md); a stage's jobs read it as "
    "results/<run>/config/<stage>.yaml.",
], pre=text)  # fmt: skip
