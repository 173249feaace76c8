# The operator and the router: one image, `trtfleet operator` / `trtfleet router`. It also runs adapter-convert
# and checkpoint-prepare Jobs, and carries /opt/trtfleet/cli: trtfleet with a Python of its own
# (trtfleet/clibundle.py), which an init container copies into build and quantizing prepare pods that run
# NVIDIA's stock TensorRT-LLM images, whatever their Python.
# Build from the repository root: docker build -f images/trtfleet.Dockerfile -t ghcr.io/trtfleet/trtfleet:0.1.0 .
# (`make images` builds all three images.)
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.9.5
# The bundle's interpreter: python-build-standalone (portable to glibc 2.17, so to every Ubuntu of NVIDIA's
# images); its minor version must be the wheels' (3.11).
ARG BUNDLE_PYTHON=3.11.11

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trtfleet ./trtfleet
COPY engines ./engines
COPY router ./router
COPY operator ./operator
# s3 (boto3): the batch store and s3:// sources; hf (huggingface_hub): hf:// sources of convert/prepare Jobs
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[s3,hf]"

FROM ${PYTHON_IMAGE} AS cli
ARG BUNDLE_PYTHON
COPY --from=uv /uv /usr/local/bin/uv
COPY --from=build /wheels /wheels
RUN uv python install --install-dir /opt/pbs "${BUNDLE_PYTHON}" \
    && bundle_python="$(ls -d /opt/pbs/cpython-*/bin/python3 | head -1)" \
    && uv pip install --python "${bundle_python}" --break-system-packages --no-cache /wheels/*.whl \
    && "${bundle_python}" -m trtfleet.clibundle --out /opt/trtfleet/cli

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 trtfleet && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin trtfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --from=cli /opt/trtfleet/cli /opt/trtfleet/cli
USER 10001:10001
ENTRYPOINT ["trtfleet"]
CMD ["--help"]
