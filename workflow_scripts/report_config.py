"""The configuration a run used (workflow keys and every stage section), as config.yaml and as
the report's page showing it inline."""

from pathlib import Path

import yaml
from report_page import write_page

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
output = snakemake.output
text = yaml.safe_dump(dict(snakemake.params.section), sort_keys=False)
Path(output.config).write_text(text)
write_page(output.page, "Configuration", [
    "The configuration this run used: workflow keys and every stage section, each stage's keys "
    "the fields of its fid dataclass (config/README.md); a stage's jobs read it as "
    "results/<run>/config/<stage>.yaml.",
], pre=text)  # fmt: skip
