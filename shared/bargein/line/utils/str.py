"""``line.utils.str``: string checks Line's tools use, chiefly for phone numbers.

:class:`~bargein.line.tools.system_tools.TransferToolCall` refuses a destination that is not E.164,
because the telephony side dials the string as given: a national format ("(555) 010-0100") would
be dialled wrongly or not at all. The check is syntactic, as Line's was: it does not ask whether a
number is allocated, so test numbers and short country plans pass.
"""

from __future__ import annotations

import re

__all__ = ["is_e164_phone_number"]

# "+", then 5 to 15 ASCII digits: the longest E.164 number is 15 digits, and the shortest real ones
# (a one-digit country code with a four-digit plan, as some small territories have) are 5.
_E164 = re.compile(r"\+[0-9]{5,15}")


def is_e164_phone_number(phone: str) -> bool:
    """Whether ``phone`` is written in E.164 form: ``+`` and 5 to 15 digits, nothing else (no spaces,
    dashes or brackets)."""
    return _E164.fullmatch(phone) is not None
