"""The speech-detection service (``docs/speech.md``); its parts are in :mod:`bargein.speech`."""
