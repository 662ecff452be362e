# Offline stand-in for apache/spark:<version>-…-python3: a Spark distribution built from the
# `pyspark` wheel on a Debian 12 base (mmdebstrap + docker import: `./dev images`). Same layout
# as the official image where ctiflow relies on it:
#   /opt/spark/{bin,sbin,jars,conf}   (bin, sbin, jars are the wheel's own)
#   /opt/spark/python/pyspark          the pyspark package; /opt/spark/python/lib/py4j-*-src.zip and
#                                      lib/pyspark.zip (what Spark puts on its Python workers' path)
#   SPARK_HOME=/opt/spark, user `spark` (uid 185), /usr/bin/tini, Java 17, python3 (3.11)
# The spark-master service runs it; deploy/Dockerfile builds the ctiflow image FROM it.
#
#   docker build -f deploy/offline/spark.Dockerfile --build-arg BASE_IMAGE=ctiflow/debian:bookworm .
# (the build context is the repository root, filtered by spark.Dockerfile.dockerignore)
ARG BASE_IMAGE=ctiflow/debian:bookworm
FROM ${BASE_IMAGE}
ARG PYSPARK_VERSION=4.3.0

RUN --mount=type=secret,id=build_ca --mount=type=secret,id=build_pip \
    --mount=type=bind,source=deploy,target=/build \
    set -eux; \
    . /build/build-env.sh; \
    python3 -m venv /tmp/pyspark-venv; \
    /tmp/pyspark-venv/bin/python -m pip install -q --no-deps --find-links /build/wheels "pyspark==${PYSPARK_VERSION}"; \
    site="$(/tmp/pyspark-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    mkdir -p /opt/spark/python/lib /opt/spark/conf /opt/spark/work-dir; \
    mv "$site/pyspark" /opt/spark/python/pyspark; \
    rm -rf /tmp/pyspark-venv; \
    for d in bin sbin jars; do ln -s "python/pyspark/$d" "/opt/spark/$d"; done; \
    cp /opt/spark/python/pyspark/python/lib/py4j-*-src.zip /opt/spark/python/lib/; \
    cd /opt/spark/python; \
    python3 -c 'import pathlib, zipfile; z = zipfile.ZipFile("lib/pyspark.zip", "w", zipfile.ZIP_DEFLATED); [z.write(p) for p in sorted(pathlib.Path("pyspark").rglob("*")) if p.is_file() and p.parts[1] not in ("jars", "bin", "sbin") and "__pycache__" not in p.parts]'; \
    cd /; \
    echo "Spark ${PYSPARK_VERSION} (from the pyspark wheel)" > /opt/spark/RELEASE; \
    groupadd --system --gid 185 spark; \
    useradd --system --uid 185 --gid 185 --home-dir /opt/spark --no-create-home spark; \
    chown -R spark:spark /opt/spark/work-dir; \
    chmod -R a+rX /opt/spark; \
    /opt/spark/bin/spark-class org.apache.spark.deploy.master.Master --help 2>&1 | grep -q Usage

ENV SPARK_HOME=/opt/spark \
    PATH=/opt/spark/bin:/opt/spark/sbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /opt/spark/work-dir
USER spark
