# A TensorRT-LLM release image plus NVIDIA ModelOpt's examples/llm_ptq (hf_ptq.py and its helpers), for the
# quantizing prepare Jobs of runtime: pytorch BaseModels (quantization.mode fp8, int4_awq, int8_weight_only).
# No stock image carries those examples; the operator refuses such BaseModels until the chart's
# operator.images.modelopt names an image built from this file. trtfleet itself comes from an init container.
# Build it FROM the TensorRT-LLM release your BaseModels name in spec.engine.image:
#   docker build -f images/modelopt.Dockerfile --build-arg TRTLLM_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:<tag> \
#     -t <registry>/trtfleet-modelopt:<tag> images/
ARG TRTLLM_IMAGE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3

FROM ${TRTLLM_IMAGE}
# NVIDIA's image runs as root by design (GPU device access, /dev/shm); the Job's pod drops capabilities.
# The examples of the ModelOpt release the image already has installed (TensorRT-LLM depends on
# nvidia-modelopt), so hf_ptq.py and the library it calls are of one version.
RUN set -eu; \
    version="$(python3 -c 'import importlib.metadata as m; print(m.version("nvidia-modelopt"))')"; \
    git clone --depth 1 --branch "${version}" https://github.com/NVIDIA/TensorRT-Model-Optimizer.git /tmp/modelopt; \
    mkdir -p /opt/modelopt/examples; \
    mv /tmp/modelopt/examples/llm_ptq /opt/modelopt/examples/llm_ptq; \
    rm -rf /tmp/modelopt; \
    if [ -f /opt/modelopt/examples/llm_ptq/requirements.txt ]; then \
      pip install --no-cache-dir -r /opt/modelopt/examples/llm_ptq/requirements.txt; fi
