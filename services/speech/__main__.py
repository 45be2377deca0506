"""``python -m services.speech``: the speech-detection service.

It owns sessions' audio through leases like the reasoning service, runs Silero VAD for all of them
in batched inference calls and publishes the user's turn events. Wiring only; see
:mod:`bargein.hosting.service` and :mod:`bargein.speech.session`.
"""

import sys

from bargein.hosting.service import main
from bargein.speech.session import speech_factory
from bargein.wire.names import TIER_SPEECH

if __name__ == "__main__":
    sys.exit(main(TIER_SPEECH, speech_factory))
