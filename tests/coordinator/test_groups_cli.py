"""``kcoord groups``' table layout (the CLI end to end is in tests/integration/test_groups_cli.py)."""

import io

from wcwidth import wcswidth

from coordinator.groups_cli import _table


def starts_of(line: str, values: list[str]) -> list[int]:
    """The terminal column where each of ``values`` starts in ``line``."""
    out, pos = [], 0
    for v in values:
        at = line.index(v, pos)
        out.append(wcswidth(line[:at]))
        pos = at + len(v)
    return out


def test_columns_line_up_as_a_terminal_shows_them() -> None:
    """Padding went by length: a name in CJK characters (two columns each) or with a combining accent
    (none) pushed or pulled every later column of its row out of line."""
    rows: list[list[object]] = [["消费者组", "Stable", 3], ["plain", "Empty", 12], ["cafe\u0301", "Dead", None]]
    out = io.StringIO()
    _table(["GROUP", "STATE", "MEMBERS"], rows, out)
    lines = out.getvalue().splitlines()
    expected = starts_of(lines[0], ["GROUP", "STATE", "MEMBERS"])
    assert expected == [0, 10, 18]  # the widest group shows 8 columns wide, then two spaces
    for line, row in zip(lines[1:], rows, strict=True):
        shown = [str(v) for v in row if v is not None]
        assert starts_of(line, shown) == expected[: len(shown)]


def test_a_control_character_counts_as_its_length() -> None:
    out = io.StringIO()
    _table(["GROUP", "STATE"], [["a\tb", "Empty"], ["abcd", "Stable"]], out)
    assert out.getvalue().splitlines() == ["GROUP  STATE", "a\tb    Empty", "abcd   Stable"]
