# The router image every PDInferenceService names in spec.router.image (none is
# published with the pinned routers' Python launchers; the operator refuses a
# service without one and prints these commands):
#   docker build -f operator/images/router.Dockerfile --build-arg ROUTER=vllm-router \
#     --build-arg VERSION=0.1.17 -t <registry>/vllm-router:0.1.17 .
#   docker build -f operator/images/router.Dockerfile --build-arg ROUTER=sglang-router \
#     --build-arg VERSION=0.3.2 -t <registry>/sglang-router:0.3.2 .
FROM python:3.11-slim
ARG ROUTER=vllm-router
ARG VERSION=0.1.17
RUN pip install --no-cache-dir "${ROUTER}==${VERSION}"
USER 65532:65532
