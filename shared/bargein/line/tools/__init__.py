"""``line.tools``: the tool helpers Line's examples import (``end_call`` and its declarations)."""
