"""Text from outside (a server's answer, an engine's label, a daemon's state, a file) as a terminal shows it.

Every command that prints such text passes it through `shown` (a plain string) or `plain` (a rich `Text`, never
parsed as markup): a model id can then neither move the cursor, retitle or clear the terminal, reorder what
follows it (bidirectional overrides), nor close a markup tag it was placed in. What it cannot do is written
visibly, as Python writes the character in a string literal (ESC is `\\x1b`), so a reader still sees what the
server sent.
"""

from rich.text import Text

# C0 controls (newline and tab included: every field shown is one line), DEL, C1 controls (NEL among them), the
# Unicode line and paragraph separators (line breaks to YAML 1.1 and many terminals), the bidirectional
# embeddings, overrides and isolates, and lone surrogates (JSON's "\ud800", or a file name's undecodable byte as
# Python reads argv), which no terminal's encoding can write: printing one raised UnicodeEncodeError.
_UNSAFE = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    *range(0x2028, 0x202F),
    *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),
]
_ESCAPES = {code: repr(chr(code))[1:-1] for code in _UNSAFE}


def shown(text: str) -> str:
    """`text` with every character that would act on the terminal, rather than print, written as its escape."""
    return text.translate(_ESCAPES)


def plain(text: str, style: str = "") -> Text:
    """`text` as a rich Text: shown, and never read as markup, whatever brackets it holds."""
    return Text(shown(text), style=style)
