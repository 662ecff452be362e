#!/usr/bin/env bash
# Entry point of the ctiflow image (run under tini).
#
#   <ctiflow subcommand> [args]   e.g. `run /app/examples/demo-flows.yaml`
#   ctiflow <subcommand> [args]
#       → wait until a Kafka bootstrap server (CTIFLOW_BOOTSTRAP) accepts connections, prepare
#         the Spark driver's address, then exec ctiflow.
#   a program given by path (/opt/spark/bin/spark-class …) or one of bash, sh, python, python3,
#   java, spark-class, spark-submit
#       → exec'd unchanged (the Spark worker service and the one-shot shell scripts use this).
#   (Anything else is a ctiflow subcommand: `users`, say, is also a coreutils program, so the
#   choice cannot be "whatever is on PATH".)
#
# Settings: CTIFLOW_WAIT_TIMEOUT (seconds, default 180; 0 = do not wait).
#           CTIFLOW_BROKER_FORWARD=host:port (offline stand-in broker only): forward this
#           container's 127.0.0.1:port to host:port first (deploy/broker-forward.py), for every
#           command, the Spark worker's included.
set -euo pipefail

log() { printf 'ctiflow-entrypoint: %s\n' "$*" >&2; }

wait_for_kafka() {
  local timeout=${CTIFLOW_WAIT_TIMEOUT:-180}
  [ -n "${CTIFLOW_BOOTSTRAP:-}" ] && [ "$timeout" != 0 ] || return 0
  local deadline=$(( $(date +%s) + timeout )) server host port
  local -a servers
  IFS=',' read -r -a servers <<< "$CTIFLOW_BOOTSTRAP"
  while :; do
    for server in "${servers[@]}"; do
      server=${server#*://}            # PLAINTEXT://host:port → host:port
      host=${server%:*}; port=${server##*:}
      if timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null; then
        return 0
      fi
    done
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "no Kafka bootstrap server of '$CTIFLOW_BOOTSTRAP' accepted a connection within ${timeout}s"
      exit 1
    fi
    sleep 2
  done
}

spark_driver_address() {
  # ctiflow defaults SPARK_LOCAL_IP to 127.0.0.1 (right for local[*]); on a cluster the
  # executors must reach the driver, so advertise this container's address instead.
  case "${CTIFLOW_SPARK_MASTER:-}" in
    spark://*|k8s://*)
      if [ -z "${SPARK_LOCAL_IP:-}" ]; then
        # The container's address on the compose network (not loopback).
        SPARK_LOCAL_IP=$(hostname -i 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v -m1 '^127\.' || true)
        if [ -z "$SPARK_LOCAL_IP" ]; then
          SPARK_LOCAL_IP=$(python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')
        fi
        export SPARK_LOCAL_IP
      fi ;;
  esac
}

start_broker_forward() {
  [ -n "${CTIFLOW_BROKER_FORWARD:-}" ] || return 0
  local port=${CTIFLOW_BROKER_FORWARD##*:} i
  python3 /opt/ctiflow/broker-forward.py "$CTIFLOW_BROKER_FORWARD" &
  for i in $(seq 50); do
    if timeout 1 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$port" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "the broker forwarder did not start on 127.0.0.1:$port"
  exit 1
}

start_broker_forward

if [ $# -eq 0 ]; then
  set -- --help
fi
if [ "$1" = ctiflow ]; then
  shift
else
  case "$1" in
    */*|bash|sh|python|python3|java|spark-class|spark-submit) exec "$@" ;;
  esac
fi

wait_for_kafka
spark_driver_address
exec ctiflow "$@"
