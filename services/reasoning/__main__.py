"""``python -m services.reasoning`` (or ``bargein reasoning``): the reasoning service.

It owns sessions through leases, runs ``BARGEIN_AGENT``'s routes for each, publishes the agent's
output and cancels generations on interrupts. Wiring only; see :mod:`bargein.service`.
"""

import sys

from bargein.names import TIER_REASONING
from bargein.service import main

if __name__ == "__main__":
    sys.exit(main(TIER_REASONING))
