#!/usr/bin/env bash
# docs/operations/deploying.md: a job's first batch and run on the compose stack's ctiflow-image workers
# (ctiflow run, nothing shipped) against stock workers (ctiflow submit, the environment archive),
# alternately, twice each. Needs the images (./dev images) and a Docker engine; leaves the stack down.
set -u
cd "$(dirname "$0")/../.."

F="-p ctiflow-test -f docker-compose.yml -f docker-compose.offline.yml -f integration_tests/cluster/docker-compose.cluster.yml"
docker compose $F up -d --wait kafka spark-master spark-worker >/dev/null 2>&1
docker compose $F --profile cluster up -d --wait --scale stock-worker=3 objstore stock-master stock-worker >/dev/null 2>&1
export CTIFLOW_BOOTSTRAP=localhost:9094
C=.venv/bin/ctiflow
W=$(mktemp -d); rm -rf $W; mkdir -p $W; chmod 777 $W
$C demo-data --out $W/demo >/dev/null
$C topics create --config examples/demo-flows.yaml >/dev/null
$C produce --topic flows --schema flow --key-field device $W/demo/flows.jsonl | tail -1
export JAVA_HOME=$(dirname $(dirname $(readlink -f $(which java))))
mkdir -p $W/jc && javac -d $W/jc -cp ".venv/lib/python3.11/site-packages/pyspark/jars/*" integration_tests/objectstore/ObjectStoreFileSystem.java && jar cf $W/objstore.jar -C $W/jc .
chmod -R a+rX $W
for i in 1 2; do
  sed "s/^job: demo-flows/job: img-$i/" examples/demo-flows.yaml > $W/img-$i.yaml
  docker compose $F run --rm --no-deps -e CTIFLOW_CHECKPOINT=/checkpoints/img-$i -v $W:/jobs:ro job-flows run /jobs/img-$i.yaml --until-end 2>&1 | grep "first batch" | sed "s/^/A image workers: /"
  sed "s/^job: demo-flows/job: stock-$i/" examples/demo-flows.yaml > $W/stock-$i.yaml
  printf '  checkpoint: objstore://bucket/stock-%s\n  conf:\n    spark.hadoop.fs.objstore.impl: ObjectStoreFileSystem\n    spark.hadoop.fs.objstore.root: http://objstore:9000\n' $i >> $W/stock-$i.yaml
  docker compose $F --profile cluster run --rm -v $W:/jobs:ro submitter submit /jobs/stock-$i.yaml --master spark://stock-master:7077 --until-end --jars /jobs/objstore.jar --conf spark.executor.cores=1 --conf spark.cores.max=2 2>&1 | grep "first batch" | sed "s/^/B stock workers + archive: /"
done
docker compose $F --profile cluster down -v --remove-orphans >/dev/null 2>&1; rm -rf "$W"
