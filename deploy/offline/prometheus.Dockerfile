# Offline stand-in for prom/prometheus: the `prometheus` binary of Debian 12's package (2.42), on
# the Debian 12 base. `deploy/build-images` downloads the .deb with the host's apt
# (`apt-get download prometheus` into deploy/debs/, not committed); only the server and promtool
# are taken from it: the HTTP API, scraping, rules and alerts are Prometheus's own; the web UI's
# JavaScript (Debian packages it apart, libjs-*) is not installed — use the API, Grafana or
# `ctiflow status`.
ARG BASE_IMAGE=ctiflow/debian:bookworm
FROM ${BASE_IMAGE}

RUN --mount=type=bind,source=deploy,target=/build \
    set -eux; \
    deb="$(ls /build/debs/prometheus_*.deb | head -n 1)"; \
    mkdir /tmp/deb; \
    dpkg-deb -x "$deb" /tmp/deb; \
    install -m 0755 /tmp/deb/usr/bin/prometheus /tmp/deb/usr/bin/promtool /usr/local/bin/; \
    rm -rf /tmp/deb; \
    groupadd --system --gid 65533 prometheus; \
    useradd --system --uid 65533 --gid 65533 --home-dir /prometheus --no-create-home prometheus; \
    mkdir -p /prometheus /etc/ctiflow; \
    chown prometheus:prometheus /prometheus; \
    prometheus --version

USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/tini", "--", "prometheus"]
CMD ["--config.file=/etc/ctiflow/prometheus.yml", "--storage.tsdb.path=/prometheus"]
