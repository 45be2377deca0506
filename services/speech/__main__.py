"""``python -m services.speech``: the speech-detection service.

It owns sessions' audio through leases like the reasoning service, runs Silero VAD for all of them
in batched inference calls and publishes the user's turn events. Wiring only; see
:mod:`bargein.service` and :mod:`services.speech.processor`.
"""

import sys

from bargein.names import TIER_SPEECH
from bargein.service import main
from services.speech.processor import speech_factory

if __name__ == "__main__":
    sys.exit(main(TIER_SPEECH, speech_factory))
