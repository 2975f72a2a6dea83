"""The one error a request's translation raises: what was wrong, and with which parameter;
and the check every text of a request passes."""

from __future__ import annotations

__all__ = ["RequestError", "checked_text"]


class RequestError(ValueError):
    """A request that cannot be served as it is: a server answers it with HTTP 400.

    Attributes:
        message: What is wrong, for the client.
        param: The request parameter at fault (``"messages[2].content"``), or ``None``.
        code: A short machine-readable reason (``"unknown_parameter"``), or ``None``.
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def checked_text(text: str, where: str) -> str:
    """``text``, once it is text: JSON may escape a lone surrogate (``"\\ud800"``), which no
    tokenizer takes; a `RequestError` naming ``where`` then."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                f"{where} is not valid Unicode text (a lone surrogate, such as \\ud800)", where
            ) from None
    return text
