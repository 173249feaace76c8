# Engine builder and Triton runtime for GPU BaseModels: NVIDIA's Triton + TensorRT-LLM image plus
# trtfleet's engines package (`trtfleet engines build`, the model-repository renderer).
# The tag fixes TRT-LLM 1.2.1 / TensorRT 10.14; it is part of every engine's content address.
# Build from the repository root: docker build -f images/trtllm-runtime.Dockerfile -t ghcr.io/trtfleet/trtllm-runtime:0.1.0-25.12 .
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trtfleet ./trtfleet
COPY engines ./engines
COPY router ./router
COPY operator ./operator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${TRITON_IMAGE}
COPY --from=build /wheels /wheels
# Only what the build runner needs; the image already has numpy, TensorRT-LLM and Triton.
RUN pip install --no-cache-dir "pydantic>=2.9,<3" "pyyaml>=6" "safetensors>=0.4" \
    && pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
# NVIDIA's image runs as root by design (GPU device access, /dev/shm); the Deployment drops capabilities.
ENTRYPOINT ["trtfleet"]
