"""``line.utils``: the helpers Line 0.1 shipped beside its agent API.

Line's examples and agents import these by module path (``line.utils.dtmf_lookahead_buffer``,
``line.utils.gemini_utils``, ...), so each module is here under the same name and works on bargein's
events. They are plain functions over events and provider types: none of them touches the runtime,
so they behave the same in a test, in ``LocalSession`` and on the distributed services.

``gemini_utils`` needs the ``google-genai`` package (the ``line`` extra: ``pip install
'bargein[line]'``); it is imported only when a Gemini helper is called, so the other modules, and
the ones that import ``line.utils``, work without it.
"""
