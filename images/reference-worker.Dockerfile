# trtfleet's CPU reference engine: the real tritonserver from the nvidia-pytriton wheel serving the
# tiny Llama with TensorRT-LLM's tensors and LoRA cache contract. Ships the sample adapters.
# Build from the repository root: docker build -f images/reference-worker.Dockerfile -t ghcr.io/trtfleet/reference-worker:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trtfleet ./trtfleet
COPY engines ./engines
COPY router ./router
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[reference]"

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 trtfleet && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin trtfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The model and adapters where the example BaseModel/Adapters point (file:///opt/trtfleet/...).
COPY engines/trtfleet_engines/reference/assets/tiny-llama /opt/trtfleet/models/tiny-llama
COPY engines/trtfleet_engines/reference/assets/adapters /opt/trtfleet/adapters
USER 10001:10001
EXPOSE 8000 8001 8002
ENTRYPOINT ["trtfleet", "worker"]
CMD ["--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", "--host", "0.0.0.0"]
