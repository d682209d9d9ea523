"""config/README.md is the key reference of the workflow's config (issue 47.5): every key of
config/config.schema.yaml has a row there, and every row names a key the schema knows, so that
neither drifts from the other. Guides and measurements live in docs/ (docs/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "config" / "README.md"


def documented_keys() -> dict[str, str]:
    """{each key of a row's first cell: the row's description} of the tables under "Workflow
    keys" and "Stage sections" (a key's root is what the schema names: `data.downloads.{name}`
    documents `data`; a cell may name several, `init_reader`, `init_retriever`)."""
    text = README.read_text()
    start = text.index("## Workflow keys")
    end = text.index("\n### ", text.index("## Stage sections"))
    rows = re.findall(r"^\| ([^|]+) \| (.*?) \|\s*$", text[start:end], flags=re.M)
    return {
        key: description for cell, description in rows for key in re.findall(r"`([^`]+)`", cell)
    }


def test_every_schema_key_has_a_row_and_every_row_a_schema_key():
    schema = yaml.safe_load((ROOT / "config" / "config.schema.yaml").read_text())
    keys = set(schema["properties"])
    rows = documented_keys()
    roots = {re.split(r"[.{ ,/]", key)[0] for key in rows}
    assert keys - roots == set(), f"schema keys without a row in {README}: {keys - roots}"
    assert roots - keys == set(), f"rows of {README} naming no schema key: {roots - keys}"
    assert all(description.strip() for description in rows.values())


def test_the_guides_are_linked_and_exist():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = re.findall(r"\]\(([\w-]+\.md)\)", index)
    assert sorted(pages) == sorted(
        p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"
    )
    assert "docs/README.md" in README.read_text()
