"""The two user-facing errors of this package: bad scenario input and unparseable answers."""

from __future__ import annotations


class ScenarioError(ValueError):
    """Bad scenario input (file, folder, bucket text, style); the message is one line naming the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class AnswerError(ValueError):
    """A server answer that is neither JSON nor server-sent events; one line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(text: str) -> str:
    """Collapse any newlines (Pillow and OS messages can carry them) so errors stay one line."""
    return " ".join(text.split())
