"""Text from outside, as a terminal shows it: nothing in it acts on the terminal or is read as markup."""

import io

import pytest
from rich.console import Console

from exporter.display import plain, shown


@pytest.mark.parametrize(
    ("sent", "written"),
    [
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # retitles the terminal
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clears the screen
        ("a\nb\rc\td", "a\\nb\\rc\\td"),  # a second line, or an overwritten one
        ("\x9b31m", "\\x9b31m"),  # the C1 form of ESC [
        ("admin\u202egnp.exe", "admin\\u202egnp.exe"),  # right-to-left override
        ("a\u2028b\x85c", "a\\u2028b\\x85c"),  # line breaks to YAML 1.1
        ("\x00\x7f", "\\x00\\x7f"),
        ("a\ud800b\udcff", "a\\ud800b\\udcff"),  # lone surrogates: no encoding writes them
        ("Llama-3.1-8B [fp8] ünïcode 模型", "Llama-3.1-8B [fp8] ünïcode 模型"),  # printable text is untouched
    ],
)
def test_a_character_that_acts_on_the_terminal_is_written_as_its_escape(sent: str, written: str) -> None:
    assert shown(sent) == written


@pytest.mark.parametrize("markup", ["[/]evil", "[bold red]x[/bold red]", "[link=http://x]y", "\\[x]"])
def test_brackets_print_as_sent_and_are_never_markup(markup: str) -> None:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(plain(markup))
    assert out.getvalue() == markup + "\n"
