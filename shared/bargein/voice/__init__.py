"""The agent's voice: speech synthesis, word timings, and playback paced at real time.

The client edge turns each turn's streamed text into audio here and knows, word by word, what
the caller has heard. The layer is pure apart from its engines: :mod:`.phrases` cuts a turn's text
into phrases as it streams in; an engine (:mod:`.engines`: :mod:`.espeak` embedded,
:mod:`.openai_tts` on a server) makes each phrase's audio and word timings (:mod:`.speech`);
:mod:`.player` paces the audio to the caller, pauses and resumes it (the soft barge-in), clears it
on a barge-in, and turns the playback position into the text heard, to the word.
"""
