"""The embedded engine (``BARGEIN_TTS=espeak``): eSpeak NG, with the word timings of its own
synthesis callbacks.

The library and its voice data come from the ``espeakng-loader`` wheel, so nothing is needed from
the system. No maintained binding exposes eSpeak NG's synthesis callback (the one thing that says
where each word falls in the audio), so this module is a small ctypes binding of our own over the
five functions it needs (``speak_lib.h``). eSpeak NG keeps global state, so every call runs on one
thread of the process; it synthesises some hundreds of times faster than real time, so that one
thread serves every session of an edge process, off its event loop. (Its output is not exactly
reproducible: the same phrase comes out a few samples longer or shorter from one call to the next.)
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import espeakng_loader
import numpy as np

from bargein.errors import SettingsError
from bargein.voice.speech import Speech, WordTiming, complete_words, to_pcm16

log = logging.getLogger("bargein.voice.espeak")

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report errors instead of ending the process
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_RATE = 1
_EE_OK = 0
MIN_RATE, MAX_RATE = 80, 450  # words per minute eSpeak NG accepts


class _Event(ctypes.Structure):
    """``espeak_EVENT``; ``id`` is a union of an int, a pointer and eight chars."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based, in characters
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


class _Library:
    """libespeak-ng, initialised once per process; use only from :data:`_THREAD`."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        data = espeakng_loader.get_data_path().encode()
        self.rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _INITIALIZE_DONT_EXIT)
        if self.rate <= 0:
            raise RuntimeError(f"eSpeak NG did not start (data at {data.decode()})")
        self._chunks: list[np.ndarray] = []
        self._words: list[tuple[int, int, int]] = []
        self._callback = _Callback(self._on_synth)  # kept: the library holds only a raw pointer
        self.lib.espeak_SetSynthCallback(self._callback)
        self._voice: str | None = None

    def _on_synth(self, wav: Any, count: int, events: Any) -> int:
        if count > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            if event.type == _EVENT_WORD:
                self._words.append((event.text_position - 1, event.length, event.sample))
            i += 1
        return 0  # go on

    def voice(self, name: str) -> bool:
        if name != self._voice:
            if self.lib.espeak_SetVoiceByName(name.encode()) != _EE_OK:
                return False
            self._voice = name
        return True

    def synthesize(self, text: str, voice: str, rate: int) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        if not self.voice(voice):
            raise ValueError(f"eSpeak NG has no voice {voice!r}")
        self.lib.espeak_SetParameter(_RATE, rate, 0)
        self._chunks, self._words = [], []
        data = text.encode()
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if status != _EE_OK:
            raise RuntimeError(f"eSpeak NG could not speak this (error {status})")
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return audio, self._words


_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="espeak")
_library: _Library | None = None
_library_lock = threading.Lock()


def _the_library() -> _Library:
    global _library
    with _library_lock:
        if _library is None:
            _library = _Library()
        return _library


def _speak(text: str, voice: str, rate: int) -> Speech:
    library = _the_library()
    audio, found = library.synthesize(text, voice, rate)
    scale = 16_000 / library.rate
    words = tuple(
        WordTiming(start, min(start + length, len(text)), round(sample * scale))
        for start, length, sample in found
        if 0 <= start < len(text)
    )
    pcm = to_pcm16(audio, library.rate)
    return Speech(pcm, complete_words(text, words, len(pcm) // 2))


class EspeakSynthesizer:
    """eSpeak NG for every session of the process, one synthesis at a time on its own thread."""

    name = "espeak"

    def __init__(self, voice: str = "en-us", rate: int = 175) -> None:
        if not MIN_RATE <= rate <= MAX_RATE:
            raise SettingsError(f"BARGEIN_TTS_RATE: eSpeak NG speaks {MIN_RATE}-{MAX_RATE} words a minute")
        self.voice = voice
        self.rate = rate
        if not _THREAD.submit(lambda: _the_library().voice(voice)).result():
            raise SettingsError(f"BARGEIN_TTS_VOICE: eSpeak NG has no voice {voice!r} (try en-us, en)")
        log.info("speech synthesis: eSpeak NG, voice %s at %d words a minute", voice, rate)

    async def synthesize(self, text: str, *, voice: str | None = None) -> Speech:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_THREAD, _speak, text, voice or self.voice, self.rate)

    async def aclose(self) -> None:
        return None
