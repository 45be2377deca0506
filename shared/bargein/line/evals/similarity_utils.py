"""``line.evals.similarity_utils``: deciding whether an agent's words match what a test expected.

A conversation test cannot compare an LLM's answer with the expected one character by character,
so the checks ask a model (Gemini, through ``google-genai``) whether two texts mean the same. Two
rules come first and need no model:

* ``"*"`` on either side matches anything;
* texts equal after trimming and lower-casing match.

A text written ``<like this>`` is a statement about the other text ("<asks for the caller's
name>"): the model is asked whether the text does what the statement says. Two statements are
compared with each other.

Gemini is reached with ``google.genai.Client()``, configured from the environment as usual: an API
key in ``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``, and ``GOOGLE_GEMINI_BASE_URL`` for another
endpoint (a proxy, or a local stand-in in tests). ``google-genai`` is bargein's optional ``line``
extra and is imported only when a model is actually asked, so the wildcard and exact rules work
without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SIMILARITY_MODEL",
    "SimilarityResult",
    "check_string_statement",
    "extract_statement",
    "is_similar_dict",
    "is_similar_str",
    "is_similar_text",
    "is_similar_via_single_text_comparison",
    "is_similar_via_statement_pattern",
    "is_statement_pattern",
]

SIMILARITY_MODEL = "gemini-2.5-flash-lite"
"""The Gemini model the checks ask (Line's choice: fast and cheap, and the task is easy)."""

_TEMPERATURE = 0.1  # near-deterministic verdicts


@dataclass
class SimilarityResult:
    """A check's verdict: ``is_success`` is True or False, or None when the check did not apply
    (``is_similar_via_statement_pattern`` on two plain texts); ``error`` says why it failed."""

    is_success: bool | None
    error: str | None


def _match() -> SimilarityResult:
    return SimilarityResult(is_success=True, error=None)


def _mismatch(error: str) -> SimilarityResult:
    return SimilarityResult(is_success=False, error=error)


def is_statement_pattern(s: str) -> bool:
    """Whether ``s`` is a statement, written ``<...>``."""
    stripped = s.strip()
    return stripped.startswith("<") and stripped.endswith(">")


def extract_statement(s: str) -> str:
    """The statement inside ``<...>``."""
    return s.strip()[1:-1]


_STATEMENT_PROMPT = """\
You are grading a voice agent's reply against a requirement.

Requirement: "{statement}"
Reply: "{text}"

Does the reply satisfy the requirement, i.e. does it say or do what the requirement describes? \
It does not need to use the same words.

Answer with exactly "YES", or with "NO: " followed by a one-sentence reason.

For example, the requirement "asks for the caller's name" is satisfied by "Who am I speaking \
with?" (YES) and not by "How old are you?" (NO: it asks for an age, not a name).
"""

_COMPARISON_PROMPT = """\
You are grading a voice agent's reply against the reply a test expected.

Text A: "{a}"
Text B: "{b}"

Do the two texts mean the same thing? Paraphrases and synonyms count as the same. Ignore \
conversational openers and fillers ("Okay", "Great", "Thanks", "Alright", "Now", ...). Affirmations \
such as "yes", "correct" and "that's right" are the same. Numbers and codes are the same when only \
their spacing differs or when one is spelled out in words ("four two" and "42").

Answer with exactly "YES", or with "NO: " followed by a one-sentence reason.
"""


def _ask_gemini(prompt: str) -> str:
    """The model's answer to ``prompt`` (one blocking request, as Line's checks made)."""
    try:
        from google import genai
        from google.genai import types
    except ImportError as exc:
        raise ImportError(
            "comparing texts by meaning needs the google-genai package: pip install 'bargein[line]'"
        ) from exc
    with genai.Client() as client:  # closed at once: no connections left for the GC to report
        response = client.models.generate_content(
            model=SIMILARITY_MODEL,
            contents=prompt,
            config=types.GenerateContentConfig(temperature=_TEMPERATURE),
        )
    return (response.text or "").strip()


def _verdict(answer: str, unreadable: str) -> SimilarityResult:
    """Read a ``YES`` / ``NO: reason`` answer; anything else fails with ``unreadable``."""
    head = answer.upper()
    if head.startswith("YES"):
        return _match()
    if head.startswith("NO"):
        return _mismatch(answer[2:].strip().lstrip(":").strip())
    return _mismatch(unreadable)


def check_string_statement(statement: str, actual_text: str) -> SimilarityResult:
    """Ask the model whether ``actual_text`` does what ``statement`` (without ``<>``) describes."""
    answer = _ask_gemini(_STATEMENT_PROMPT.format(statement=statement, text=actual_text))
    return _verdict(answer, f"Unexpected answer from the statement check: {answer}")


def is_similar_str(a: str, b: str) -> SimilarityResult:
    """Whether ``a`` and ``b`` match: ``"*"`` matches anything, ``<statement>`` is checked against
    the other text, and two texts match when they are equal (ignoring case and surrounding space)
    or the model says they mean the same."""
    if a == "*" or b == "*":
        return _match()
    by_statement = is_similar_via_statement_pattern(a, b)
    if by_statement.is_success is not None:
        return by_statement
    return is_similar_via_single_text_comparison(a, b)


def is_similar_via_statement_pattern(a: str, b: str) -> SimilarityResult:
    """The statement rule: not applicable (``is_success`` None) unless ``a`` or ``b`` is a
    ``<statement>``; two statements are compared as texts."""
    a_states, b_states = is_statement_pattern(a), is_statement_pattern(b)
    if a_states and b_states:
        return is_similar_str(extract_statement(a), extract_statement(b))
    if a_states:
        return check_string_statement(extract_statement(a), b)
    if b_states:
        return check_string_statement(extract_statement(b), a)
    return SimilarityResult(is_success=None, error=None)


def is_similar_via_single_text_comparison(a: str, b: str) -> SimilarityResult:
    """Equal ignoring case and surrounding space, or the same meaning by the model's judgement."""
    if a.strip().lower() == b.strip().lower():
        return _match()
    answer = _ask_gemini(_COMPARISON_PROMPT.format(a=a, b=b))
    return _verdict(answer, f'Unexpected answer from the similarity check: {answer}\nA: "{a}"\nB: "{b}"')


def is_similar_text(a: list[str] | str, b: list[str] | str) -> SimilarityResult:
    """Whether some text of ``a`` matches some text of ``b`` (a single string is a list of one):
    an expected turn may list several acceptable answers. The pairs are tried in order until one
    matches, so put the likeliest (or ``"*"``) first to spare model calls.

    Raises ``RuntimeError`` when both are empty lists; one empty list does not match.
    """
    left = [a] if isinstance(a, str) else list(a)
    right = [b] if isinstance(b, str) else list(b)
    if not left and not right:
        raise RuntimeError("is_similar_text: both lists of texts are empty")
    if not left or not right:
        return _mismatch(f"One list is empty: a={left}, b={right}")
    last = SimilarityResult(is_success=None, error=None)
    for x in left:
        for y in right:
            last = is_similar_str(x, y)
            if last.is_success:
                return _match()
    if len(left) == 1 and len(right) == 1:  # one comparison: its reason says more than the lists
        return _mismatch(f"{left} != {right}" + (f" ({last.error})" if last.error else ""))
    return _mismatch(f"No text of a matches a text of b: a={left}, b={right}")


def is_similar_dict(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> SimilarityResult:
    """Whether ``actual`` matches ``expected`` key by key: the same keys; strings compared with
    :func:`is_similar_str`, nested dicts recursively, anything else with ``==``; an expected value
    of None accepts anything."""
    missing = sorted(set(expected) - set(actual), key=str)
    extra = sorted(set(actual) - set(expected), key=str)
    if missing or extra:
        problems = ([f"missing keys: {missing}"] if missing else []) + (
            [f"extra keys: {extra}"] if extra else []
        )
        return _mismatch(f"Key mismatch - {', '.join(problems)}")
    for key, want in expected.items():
        got = actual[key]
        if want is None:
            continue
        if isinstance(want, str) and isinstance(got, str):
            result = is_similar_str(got, want)
            if result.is_success is False:
                return _mismatch(f"String value mismatch for key '{key}': {result.error}")
        elif isinstance(want, Mapping) and isinstance(got, Mapping):
            result = is_similar_dict(got, want)
            if result.is_success is False:
                return _mismatch(f"Nested dict mismatch for key '{key}': {result.error}")
        elif got != want:
            return _mismatch(f"Value mismatch for key '{key}': expected {want}, got {got}")
    return _match()
