"""``python -m services.broadcast`` (or ``bargein broadcast``): the client edge. Wiring only."""

import sys

from bargein.edge.service import main

if __name__ == "__main__":
    sys.exit(main())
