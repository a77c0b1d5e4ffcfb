# The GPU runner image: NVIDIA's TensorRT container (TensorRT 11, CUDA, Python) with mmtrt installed over it, for
# the self-hosted runners of .github/workflows/nightly.yml: the nightly, `mmtrt build-engines` and
# scripts/gpu_check.sh. Run with `--gpus all`. The tag is an assumption (pick the release that ships TensorRT 11):
# not built on our machines (no Docker engine, no access to NVIDIA's registry); checked by hadolint.
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:26.01-py3
FROM ${TENSORRT_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends make git python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# the container's own TensorRT stays visible; pip adds only what it lacks
RUN python3 -m venv --system-site-packages .venv \
    && .venv/bin/pip install --no-cache-dir -e '.[tensorrt,test,report]'
ENV MMTRT_NO_PROGRESS=1
ENTRYPOINT [".venv/bin/mmtrt"]
CMD ["nightly", "scripts/nightly.yaml", "-o", "out/nightly/report"]
