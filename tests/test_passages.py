"""DPR passage files: streaming, sharding by byte range, validation with file and line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fid.data.passages import (
    Passage,
    check_unique_ids,
    count_passages,
    iter_passages,
    load_passages,
    passage_shard_bounds,
)
from fid.errors import DataError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SUBSET = SAMPLES / "dpr" / "psgs_w100.subset.tsv"
SQUAD = SAMPLES / "squad-open-tiny" / "psgs_w100.tsv"


def write(tmp_path: Path, text: str, name: str = "psgs.tsv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_real_subset_streams_all_passages():
    passages = list(iter_passages(SUBSET))
    assert len(passages) == 751 == count_passages(SUBSET)
    first, last = passages[0], passages[-1]
    assert first.id == "128529"
    assert first.title == "Erie Canal"
    assert first.text.startswith("elevation of . Lake Erie has a mean surface elevation")
    assert not first.text.startswith('"')  # csv quotes are removed
    assert last == Passage(id="20996458", title="Book of the Secret Supper", text=last.text)
    assert last.text.endswith("with an angel from the second heaven and")
    assert len({p.id for p in passages}) == 751


def test_doubled_quotes_inside_text_are_unescaped():
    passages = load_passages(SQUAD)
    assert len(passages) == 167
    assert '(under which the game would have been known as "Super Bowl L")' in passages["2"].text
    assert passages["1"].title == "Super Bowl 50"


@pytest.mark.parametrize("n_shards", [1, 2, 3, 7])
def test_shards_partition_the_file(n_shards):
    expected = [p.id for p in iter_passages(SUBSET)]
    bounds = [passage_shard_bounds(SUBSET, k, n_shards) for k in range(n_shards)]
    header_end = len(SUBSET.read_bytes().split(b"\n", 1)[0]) + 1
    assert bounds[0][0] == header_end
    assert bounds[-1][1] == os.path.getsize(SUBSET)
    for (_, end), (next_start, _) in zip(bounds[:-1], bounds[1:], strict=True):
        assert end == next_start  # contiguous, no gap, no overlap
    ids = [p.id for start, end in bounds for p in iter_passages(SUBSET, start, end)]
    assert ids == expected
    if n_shards > 1:
        sizes = [len(list(iter_passages(SUBSET, start, end))) for start, end in bounds]
        assert min(sizes) > 0.5 * 751 / n_shards  # about equal


def test_more_shards_than_lines(tmp_path):
    path = write(tmp_path, "id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n3\tthree\tC\n")
    ids = [p.id for k in range(7) for p in iter_passages(path, *passage_shard_bounds(path, k, 7))]
    assert ids == ["1", "2", "3"]


def test_range_start_inside_a_line_belongs_to_the_previous_range(tmp_path):
    path = write(tmp_path, "id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n")
    second_line = len("id\ttext\ttitle\n")
    middle = second_line + 3
    assert [p.id for p in iter_passages(path, 0, middle)] == ["1"]
    assert [p.id for p in iter_passages(path, middle)] == ["2"]


@pytest.mark.parametrize("shard, n_shards", [(-1, 2), (2, 2), (0, 0), (1.0, 2)])
def test_shard_arguments_are_checked(shard, n_shards):
    with pytest.raises(ValueError, match="shard"):
        passage_shard_bounds(SUBSET, shard, n_shards)


def test_any_column_order_extra_columns_blank_lines_and_crlf(tmp_path):
    path = write(tmp_path, 'title\tid\textra\ttext\r\nA\t7\tx\t"a ""quoted"" text"\r\n\r\n')
    assert list(iter_passages(path)) == [Passage(id="7", title="A", text='a "quoted" text')]
    assert count_passages(path) == 1


@pytest.mark.parametrize(
    "content, line, message",
    [
        ("1\tsome text\tTitle\n", 1, "header naming the columns id, text and title"),
        ("id\ttext\n1\tsome text\n", 1, "missing: title"),
        ("", 1, "header"),
        ("id\ttext\ttitle\n1\tok\tA\n2\tmissing title\n", 3, "expected 3 tab-separated columns"),
        ("id\ttext\ttitle\n1\tok\tA\n2\t\tB\n", 3, "empty text"),
        ("id\ttext\ttitle\n1\tok\tA\n2\t   \tB\n", 3, "empty text"),
        ("id\ttext\ttitle\n1\tok\tA\n\tno id\tB\n", 3, "empty passage id"),
    ],
)
def test_errors_name_file_and_line(tmp_path, content, line, message):
    path = write(tmp_path, content)
    with pytest.raises(DataError, match=f"psgs.tsv: line {line}: .*{message}"):
        list(iter_passages(path))


def test_header_error_shows_what_was_found(tmp_path):
    path = write(tmp_path, "pid\tbody\theading\n1\tx\ty\n")
    with pytest.raises(DataError, match=r"line 1: .*found 'pid\\tbody\\theading'"):
        count_passages(path)


def test_error_in_a_later_shard_names_the_physical_line(tmp_path):
    rows = "".join(f"{i}\ttext number {i}\tT{i}\n" for i in range(1, 9))
    path = write(tmp_path, "id\ttext\ttitle\n" + rows + "9\tbroken row\n")
    start, end = passage_shard_bounds(path, 1, 2)
    assert start > len("id\ttext\ttitle\n")
    with pytest.raises(DataError, match="line 10: expected 3"):
        list(iter_passages(path, start, end))


def test_duplicate_ids_name_both_lines(tmp_path):
    path = write(tmp_path, "id\ttext\ttitle\n1\tone\tA\n2\ttwo\tB\n1\tagain\tC\n")
    with pytest.raises(DataError, match=r"line 4: duplicate passage id '1' \(first on line 2\)"):
        load_passages(path)
    with pytest.raises(DataError, match=r"src.tsv: duplicate id '1' at positions 0 and 2"):
        check_unique_ids([p.id for p in iter_passages(path)], "src.tsv")
    check_unique_ids(["1", "2", "3"], "fine")


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.tsv"
    for call in (
        lambda: list(iter_passages(missing)),
        lambda: count_passages(missing),
        lambda: load_passages(missing),
        lambda: passage_shard_bounds(missing, 0, 2),
    ):
        with pytest.raises(DataError, match="nope.tsv: passage file not found"):
            call()


def test_fetch_passages_reads_only_the_wanted_rows(tmp_path):
    from fid.data.passages import fetch_passages

    path = tmp_path / "p.tsv"
    path.write_text(
        'id\ttext\ttitle\n1\t"a text, with ""quotes"""\tT1\n"2"\tsecond\tT2\n3\tthird\tT3\n'
    )
    found = fetch_passages(path, {"2", "1"})
    assert found["1"].text == 'a text, with "quotes"' and found["2"].title == "T2"
    with pytest.raises(DataError, match="holds no passage with id '9'"):
        fetch_passages(path, {"3", "9"})


def test_short_passages_are_counted_in_the_log(tmp_path, caplog):
    """DPR-style chunk tails of a few words are kept but reported (not an error)."""
    path = write(tmp_path, "id\ttext\ttitle\n1\tone two three four five\tA\n2\tthe end\tA\n"
                 "3\t  a  b   c d \tB\n")  # fmt: skip
    with caplog.at_level("INFO", logger="fid.data.passages"):
        assert len(list(iter_passages(path))) == 3
    assert "2 passages have fewer than 5 words (e.g. id '2')" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="fid.data.passages"):
        list(iter_passages(SQUAD))
    assert "fewer than" not in caplog.text
