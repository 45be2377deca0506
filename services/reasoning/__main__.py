"""``python -m services.reasoning`` (or ``bargein reasoning``): the reasoning service.

It owns sessions through leases, runs ``BARGEIN_AGENT``'s routes for each, publishes the agent's
output and cancels generations on interrupts. Wiring only; see :mod:`bargein.hosting.service`.
"""

import sys

from bargein.hosting.service import main
from bargein.wire.names import TIER_REASONING

if __name__ == "__main__":
    sys.exit(main(TIER_REASONING))
