"""``bargein dial +E164 --from +E164``: an outbound call through a carrier's REST API.

The carrier calls the number and, once it is answered, fetches the edge's voice webhook
(``BARGEIN_PUBLIC_URL``/v1/<carrier>/voice), exactly as for a call coming in: from there on the
call is an ordinary phone session. Credentials come from the settings (docs/telephony.md).
"""

from __future__ import annotations

import asyncio
import re
import sys

from bargein.edge.carriers.abc import CarrierError
from bargein.edge.phone import CARRIERS, status_url_for
from bargein.settings import BroadcastSettings, TelephonySettings, load

E164 = re.compile(r"^\+[1-9]\d{6,14}$")


def main(to: str, from_: str, carrier_name: str = "twilio", webhook: str | None = None) -> int:
    for number, what in ((to, "the number to call"), (from_, "--from")):
        if not E164.fullmatch(number):
            print(
                f"bargein dial: {what} must be E.164 (+ and 7 to 15 digits), got {number!r}", file=sys.stderr
            )
            return 2
    if carrier_name not in CARRIERS:
        print(f"bargein dial: --carrier must be one of {', '.join(sorted(CARRIERS))}", file=sys.stderr)
        return 2
    if webhook is None:
        public = load(BroadcastSettings).public_url
        if public is None:
            print(
                "bargein dial: set BARGEIN_PUBLIC_URL (where the carrier reaches the edge) or --webhook",
                file=sys.stderr,
            )
            return 2
        webhook = f"{public.rstrip('/')}/v1/{carrier_name}/voice"
    carrier = CARRIERS[carrier_name](load(TelephonySettings))
    print(f"calling {to} from {from_} through {carrier_name}; once answered it fetches {webhook}")
    try:
        placed = asyncio.run(carrier.dial(to, from_, webhook, status_url_for(webhook)))
    except CarrierError as exc:
        print(f"bargein dial: {exc}", file=sys.stderr)
        return 1
    print(f"call {placed.call_id}: {placed.status or 'placed'}")
    return 0
