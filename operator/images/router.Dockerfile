# The router images the operator uses by default:
#   docker build -f operator/images/router.Dockerfile --build-arg ROUTER=vllm-router \
#     --build-arg VERSION=0.1.17 -t ghcr.io/pd-operator/vllm-router:0.1.17 .
#   docker build -f operator/images/router.Dockerfile --build-arg ROUTER=sglang-router \
#     --build-arg VERSION=0.3.2 -t ghcr.io/pd-operator/sglang-router:0.3.2 .
# Override with spec.router.image to use your own.
FROM python:3.11-slim
ARG ROUTER=vllm-router
ARG VERSION=0.1.17
RUN pip install --no-cache-dir "${ROUTER}==${VERSION}"
USER 65532:65532
