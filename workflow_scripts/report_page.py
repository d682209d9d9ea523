"""One report item as a small HTML page: a title, what the numbers mean, the table itself (shown
inline by `snakemake --report`, which lists a CSV only as a download) and its CSV as a download
link; or a figure under its explanation (`write_figure_page`: the report shows a picture's
caption only behind an icon, so each figure is a page that shows both). Imported by the report
scripts (Snakemake puts their folder on sys.path)."""

import base64
import html
from pathlib import Path

STYLE = (
    "body{font-family:sans-serif;font-size:14px;margin:12px}"
    "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:3px 8px}"
    "td{text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}"
    "p{max-width:60em}pre{background:#f6f6f6;padding:8px}img{max-width:100%}"
)


def write_page(path, title, notes, table=None, csv_path=None, empty="", pre=None):
    """Writes `path`: `notes` (paragraphs), then `table` (a DataFrame, floats to 2 decimals)
    or `empty` when it has no rows, or `pre` (preformatted text); `csv_path` as a download."""
    body = [f"<h3>{html.escape(title)}</h3>"]
    body += [f"<p>{html.escape(note)}</p>" for note in notes]
    if table is not None and len(table):
        body.append(table.to_html(index=False, float_format=lambda x: f"{x:.2f}", na_rep=""))
    elif table is not None:
        body.append(f"<p><b>{html.escape(empty)}</b></p>")
    if pre is not None:
        body.append(f"<pre>{html.escape(pre)}</pre>")
    if csv_path is not None:
        data = base64.b64encode(Path(csv_path).read_bytes()).decode()
        name = html.escape(Path(csv_path).name)
        body.append(f'<p><a download="{name}" href="data:text/csv;base64,{data}">{name}</a></p>')
    _write(path, title, body)


def write_figure_page(path, title, caption, image_path):
    """Writes `path`: `caption` (the figure's reStructuredText caption, rules/report/*.rst,
    rendered by docutils, which Snakemake's reports use too) above the PNG at `image_path`,
    embedded, so that the page is one self-contained file like the report."""
    from docutils.core import publish_parts

    notes = publish_parts(caption, writer_name="html5")["fragment"]
    data = base64.b64encode(Path(image_path).read_bytes()).decode()
    alt = html.escape(title)
    _write(
        path,
        title,
        [f"<h3>{alt}</h3>", notes, f'<img alt="{alt}" src="data:image/png;base64,{data}">'],
    )


def _write(path, title, body):
    page = f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{STYLE}</style>"
    page += f"<title>{html.escape(title)}</title></head><body>{''.join(body)}</body></html>\n"
    Path(path).write_text(page)
