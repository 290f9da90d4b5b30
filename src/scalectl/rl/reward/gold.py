"""What a correct completion of one problem is: its gold answers, and where the answer is read.

A :class:`Gold` holds every acceptable answer of a problem (rows of some sets list several:
``["4", "x=4"]``, ``["\\frac{1}{2}", "0.5"]``); a completion is right when its final answer
equals any of them.  With ``think_tags`` (the recipe's ``model.think_tags``, for models
that reason inside ``<think>...</think>`` before answering) only the text after the last
``</think>`` is graded (:func:`graded_text`): an answer written while thinking does not
count, and a completion whose thinking block is not closed has no answer.  Without them, a
thinking block a completion opens with a literal ``<think>`` and never closes (one cut at
the length limit) is not graded either: what it boxed while thinking is not its answer.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Gold:
    """The gold answers of a problem and how completions are read.

    Attributes:
        answers: the acceptable final answers (strings without ``\\boxed{}``), at least one.
        think_tags: completions think inside ``<think>...</think>``; only the text after
            the last ``</think>`` is graded (:func:`graded_text`).

    Raises:
        ValueError: no answer, or an answer that is not a string.
    """

    answers: tuple[str, ...]
    think_tags: bool = False

    def __post_init__(self):
        if not self.answers or not all(isinstance(a, str) for a in self.answers):
            raise ValueError(f"a Gold needs one or more string answers, not {self.answers!r}")

    def __str__(self) -> str:
        return " | ".join(self.answers)


def graded_text(completion_text: str, think_tags: bool) -> str | None:
    """The part of a completion whose final answer is graded, or None when it has none.

    With ``think_tags``: the text after the last ``</think>``; None when there is no
    ``</think>`` (the thinking block never closed: chat templates that open it in the prompt
    leave no ``<think>`` in the completion) or when a ``<think>`` after it opens a block that
    is not closed.  ``"<think>so 41</think> \\boxed{42}"`` -> ``" \\boxed{42}"``;
    ``"<think>\\boxed{42}"`` -> None.

    Without them: the whole completion, but for a thinking block opened by its last
    ``<think>`` and never closed after it, which is cut off (``"<think>\\boxed{42}"`` ->
    ``""``, no answer; ``"\\boxed{3} <think>or 4"`` -> ``"\\boxed{3} "``); a completion
    without a literal ``<think>``, or whose blocks all close, is graded whole.
    """
    if not think_tags:
        start = completion_text.rfind(THINK_OPEN)
        if start >= 0 and THINK_CLOSE not in completion_text[start:]:
            return completion_text[:start]
        return completion_text
    end = completion_text.rfind(THINK_CLOSE)
    if end < 0:
        return None
    after = completion_text[end + len(THINK_CLOSE):]
    return None if THINK_OPEN in after else after
