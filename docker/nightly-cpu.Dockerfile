# The CPU nightly image: `docker run -v "$PWD/out:/src/out" IMAGE` runs scripts/nightly.yaml with history, cache
# and report under out/ (mounted, so they outlive the container); arguments replace the config and options.
# Not built on our machines (no Docker engine there); checked by hadolint in tests/nightly.
FROM python:3.11-slim
# Debian's package versions move with the archive; the Python side is pinned in pyproject.toml.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends make git && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 nightly
WORKDIR /src
COPY --chown=nightly:nightly . .
USER 1000
RUN make .venv/.installed
ENV MMTRT_NO_PROGRESS=1
ENTRYPOINT [".venv/bin/mmtrt", "nightly"]
CMD ["scripts/nightly.yaml", "-o", "out/nightly/report"]
