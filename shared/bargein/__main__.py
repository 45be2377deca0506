"""``python -m bargein``: the ``bargein`` command."""

import sys

from bargein.tools.cli import main

sys.exit(main())
