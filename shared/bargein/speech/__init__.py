"""The speech tier: Silero VAD batched across sessions, the turn-taking policy, the speech-to-text
seam and the per-session speech processor (see ``docs/speech.md``)."""
