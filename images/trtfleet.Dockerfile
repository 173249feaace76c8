# The operator and the router: one small image, `trtfleet operator` / `trtfleet router`.
# Build from the repository root: docker build -f images/trtfleet.Dockerfile -t ghcr.io/trtfleet/trtfleet:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trtfleet ./trtfleet
COPY engines ./engines
COPY router ./router
COPY operator ./operator
# the s3 extra (boto3): the batch store and artifacts on s3:// work in the shipped image
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[s3]"

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 trtfleet && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin trtfleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
ENTRYPOINT ["trtfleet"]
CMD ["--help"]
