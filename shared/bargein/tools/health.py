"""``bargein health``: the container's ``HEALTHCHECK``: does this container's service answer?

It asks ``/healthz`` on loopback: on ``BARGEIN_PROBE_PORT`` when that is set (every service serves
its probes there then; the deployment files set it), else on the edge's ``BARGEIN_PORT``. Exit code
0 when it answers 200, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from bargein.settings import BroadcastSettings, BrokerSettings, load

TIMEOUT_S = 3.0


def main() -> int:
    port = load(BrokerSettings).probe_port or load(BroadcastSettings).port
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            if answer.status == 200:
                return 0
            print(f"bargein health: {url} answered {answer.status}", file=sys.stderr)
    except (OSError, urllib.error.URLError) as exc:
        print(f"bargein health: {url}: {exc}", file=sys.stderr)
    return 1
