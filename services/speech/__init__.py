"""The speech-detection service: Silero VAD, batched across sessions, and the turn-taking policy.

See ``docs/speech.md``. :func:`services.speech.processor.speech_factory` is what
``python -m services.speech`` hands to :func:`bargein.service.main`.
"""
