"""Dependencies point one way: ``operators`` ← the ``jobs`` data path ← references and tools
(``ctiflow.jobs.testing``) ← CLI, bench, tests.

Every module's imports are read from its source (module level *and* inside functions, so a
function-local import cannot hide a cycle), resolved to this project's modules, and checked:

* no import cycle between modules (a package's ``__init__`` counts as a module);
* ``operators`` imports nothing of ``jobs``, ``bench``, ``pyspark`` or ``confluent_kafka``;
* no module of the data path reaches ``ctiflow.jobs.testing``, the CLI or ``bench``, even indirectly;
* nothing outside the CLI package (``ctiflow.jobs.cli`` and its modules) imports the CLI;
* ``ctiflow`` (the public Python API) sits on top: nothing of ours imports it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ctiflow", "operators", "jobs", "bench")
#: The Spark data path, in the order data flows; what a running job imports.
DATA_PATH = ("ctiflow.jobs.driver.config", "ctiflow.jobs.datapath.kafka", "ctiflow.jobs.avro.serde", "ctiflow.jobs.datapath.source.reader",
             "ctiflow.jobs.datapath.source.decoder", "ctiflow.jobs.core.rows", "ctiflow.jobs.core.runtime",
             "ctiflow.jobs.datapath.adapter", "ctiflow.jobs.datapath.sink", "ctiflow.jobs.driver.checkpoint", "ctiflow.jobs.driver.progress", "ctiflow.jobs.driver.pipeline", "ctiflow.jobs.ops.stack")


def module_name(path: Path) -> str:
    """The installed name: the folders operators/, jobs/ and bench/ are ``ctiflow.operators`` …"""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "ctiflow" else ["ctiflow", *parts])


def top(name: str) -> str:
    """The part of the design a module belongs to: ``ctiflow`` (the API), ``operators``, ``jobs``
    or ``bench``."""
    return name.removeprefix("ctiflow.").split(".")[0]


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports anywhere in its file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def external_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_operators_depend_on_nothing_of_spark_kafka_or_the_jobs():
    bad = {}
    for name, path in modules().items():
        if top(name) != "operators":
            continue
        wrong = {m for m in graph()[name] if top(m) in ("jobs", "bench")}
        wrong |= external_imports(path) & {"pyspark", "confluent_kafka"}
        if wrong:
            bad[name] = sorted(wrong)
    assert bad == {}


def test_the_public_api_package_is_on_top_nothing_of_ours_imports_it():
    users = {name for name, deps in graph().items() if any(top(d) == "ctiflow" for d in deps)
             and top(name) != "ctiflow"}
    assert users == set()


def test_only_the_cli_imports_the_cli():
    cli = {m for m in modules() if m == "ctiflow.jobs.cli" or m.startswith("ctiflow.jobs.cli.")}
    users = {name for name, deps in graph().items() if deps & cli and name not in cli}
    assert users == set()


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in g.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_data_path_reaches_no_reference_tool_or_cli():
    """A running job imports no oracle, workload, conformance replay, CLI or benchmark: they
    depend on the data path, never the other way round."""
    g = graph()
    tools = ("ctiflow.jobs.testing", "ctiflow.jobs.cli", "ctiflow.bench", "ctiflow.jobs.oracle", "ctiflow.jobs.workload", "ctiflow.jobs.conformance")
    assert set(DATA_PATH) <= set(g), sorted(set(DATA_PATH) - set(g))
    bad = {name: sorted(d for d in reachable(g, name) if any(d == t or d.startswith(t + ".") for t in tools))
           for name in DATA_PATH}
    assert {name: deps for name, deps in bad.items() if deps} == {}


def test_the_config_model_is_a_leaf_of_the_jobs():
    """``ctiflow.jobs.driver.config`` imports only ``operators`` (the enums and settings it builds),
    the text forms it shares with rule definitions and the list of secret client settings it
    shares with the Kafka clients: the CLI, the jobs and docker-compose read one model that pulls
    in no Kafka, Spark or stack code."""
    g = graph()
    deps = g["ctiflow.jobs.driver.config"]
    assert {d for d in deps if top(d) != "operators"} == {"ctiflow.jobs.core.text_forms", "ctiflow.jobs.core.secrets"}
    for leaf in ("ctiflow.jobs.core.text_forms", "ctiflow.jobs.core.secrets"):
        assert {d for d in g[leaf] if top(d) != "operators"} == set(), leaf
    assert external_imports(modules()["ctiflow.jobs.driver.config"]) & {"pyspark", "confluent_kafka"} == set()


def test_the_wire_format_is_read_and_written_through_jobs_rows():
    """Source, adapter and sink take rows apart through :mod:`ctiflow.jobs.core.rows` only: none of them
    unpickles a pack itself."""
    for name in ("ctiflow.jobs.datapath.source.decoder", "ctiflow.jobs.datapath.adapter", "ctiflow.jobs.datapath.sink"):
        assert "ctiflow.jobs.core.rows" in graph()[name], name
        assert "pickle" not in external_imports(modules()[name]), f"{name} reads pickled rows itself"


def test_every_operator_implements_the_one_operator_base_and_the_runtime_probes_none():
    """Each operator a job can configure subclasses :class:`ctiflow.operators.operator.Operator` and
    implements its abstract members (instantiable); the runtime asks it through that base class
    and its declared traits only — no ``hasattr``/``getattr`` on an operator, a plan or a
    configuration model in the modules that read them (:data:`PROBE_FREE`)."""
    import importlib
    import inspect

    from ctiflow.operators.operator import Operator

    found = {}
    for name, path in modules().items():
        if not name.startswith("ctiflow.operators."):
            continue
        for cls_name, cls in vars(importlib.import_module(name)).items():
            if (inspect.isclass(cls) and cls.__module__ == name and "process_columns" in vars(cls)
                    and cls is not Operator):
                found[cls_name] = cls
    assert {"Binner", "CountOperator", "MatchOperator", "Passthrough"} <= set(found), sorted(found)
    for cls_name, cls in found.items():
        assert issubclass(cls, Operator) and not inspect.isabstract(cls), cls_name
    probes = {}
    for name in PROBE_FREE:
        tree = ast.parse(modules()[name].read_text())
        probes[name] = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id in ("hasattr", "getattr")  # (an exception's optional attributes aside)
                        and not (n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "exc")]
    assert {name: lines for name, lines in probes.items() if lines} == {}, "members probed at these lines"


#: The modules that read operators, plans and the configuration model: each through what they
#: declare (the operator base and its traits, the plan's fields, the model's classes), never by probing.
PROBE_FREE = ("ctiflow.jobs.core.runtime", "ctiflow.jobs.core.plan", "ctiflow.jobs.driver.planner", "ctiflow.jobs.driver.config",
              "ctiflow.jobs.core.definitions", "ctiflow.jobs.driver.recognize", "ctiflow.jobs.driver.fields", "ctiflow.jobs.datapath.adapter",
              "ctiflow.jobs.ops.demo", "ctiflow.jobs.state.chunks")


def test_the_product_imports_no_benchmark():
    """``bench`` is loaded by name where the CLI runs it (``ctiflow.jobs.cli.bench.registry``): nothing of
    ``ctiflow``, ``operators`` or ``jobs`` imports it, so the product is whole without it."""
    g = graph()
    wrong = {name: sorted(d for d in deps if top(d) == "bench")
             for name, deps in g.items() if top(name) != "bench"}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


#: What an executor's Python worker runs of ours besides the Spark adapter: a key group's runtime,
#: the plan it reads, and the rule compiler it carries.
EXECUTOR_SIDE = ("ctiflow.jobs.core.runtime", "ctiflow.jobs.core.plan", "ctiflow.jobs.core.definitions", "ctiflow.jobs.core.rows")


def test_the_executor_side_loads_no_configuration_model_pydantic_or_pyspark(tmp_path):
    """One seam between driver and executors: the planner builds the plan from the job file (here:
    the demo, rules and reference join included) and pickles it; a fresh interpreter that imports
    the executor side, unpickles the plan, runs a batch of a key group through it and compiles a
    rule with the plan's own compiler has loaded neither pydantic, nor PySpark, nor the
    configuration model."""
    import pickle
    import subprocess
    import sys

    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.planner import plan_job

    plans = tmp_path / "plans.pickle"
    plans.write_bytes(pickle.dumps([plan_job(load(ROOT / "examples" / name))
                                    for name in ("demo-transactions.yaml", "demo-flows.yaml")]))
    probe = f"""
import pickle, sys
import {", ".join(EXECUTOR_SIDE)}
from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.cep.rules import Rule
plans = pickle.loads(open({str(plans)!r}, "rb").read())
for plan in plans:
    runtime = GroupRuntime(plan)
    runtime.run_batch(GroupInput([], [], [], []), final=True)
    runtime.commit()
ruled = next(p for p in plans if p.side_inputs).side_inputs[0].shared
ruled.compile(Rule("r", "x", 1, 0, "put", "stages: [{{name: a, where: 'amount > 1'}}]"))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "pyspark")
             or m in ("ctiflow.jobs.driver.config", "ctiflow.jobs.driver.planner", "ctiflow.jobs.driver.fields")))
"""
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]", got.stdout


def test_no_product_module_reads_the_match_operators_private_members():
    """``MatchOperator`` keeps its keyed states private (``_states``, ``_raw``, ``_decode`` …);
    others use its small public per-key API (``keys_held``, ``load_of``, ``process_event``,
    ``cut``, ``snapshot_summary``)."""
    import re

    private = re.compile(r"(?<![\w.])(?!self\b)(\w+)\.(_states|_raw|_decode|_decode_all|_numbers|_nfa|_shared)\b")
    found = []
    for name, path in modules().items():
        if top(name) not in ("operators", "jobs") or name == "ctiflow.operators.cep.operator":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{name}:{n}: {m.group(0)}" for m in private.finditer(line)]
    assert found == []


def test_the_group_runtime_stays_a_core_of_at_most_250_lines():
    """A key group's runtime is the generic core (time layer, keyed state, the CTI, broadcast state
    through :mod:`ctiflow.jobs.core.broadcast`): features reach it as concepts, not as special cases."""
    lines = modules()["ctiflow.jobs.core.runtime"].read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class GroupRuntime"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "#")), len(lines))
    assert end - start <= 250


#: jobs/'s rooms, each above the ones it may import (``ctiflow.jobs``'s docstring): a room imports
#: itself and the rooms below it, never one above; the tools (``cli``, ``tools``, ``testing``) are
#: imported by none of these but ``ops`` (the demo runs the workload and the oracle).
ROOMS = ("ops", "driver", "datapath", "core", "state", "avro")


def test_each_room_of_jobs_imports_only_the_rooms_below_it():
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if parts[:2] == ["ctiflow", "jobs"] and len(parts) > 2 else None

    g = graph()
    upward = []
    for name, deps in g.items():
        mine = room(name)
        if mine not in ROOMS:
            continue
        allowed = set(ROOMS[ROOMS.index(mine):]) | ({"testing"} if mine == "ops" else set())
        upward += [f"{name} → {d}" for d in deps if room(d) is not None and room(d) not in allowed]
    # core and state import each other (the runtime keeps its state in chunks; the store's rows)
    upward = [u for u in upward if not (room(u.split(" → ")[0]) == "state" and room(u.split(" → ")[1]) == "core")]
    assert upward == []
    assert {room(m) for m in modules() if room(m)} == {*ROOMS, "cli", "tools", "testing"}


def test_the_expression_room_of_cep_imports_none_of_the_rooms_beside_it():
    """``operators/cep/expr`` (the one tree and evaluator) is below the SQL front end, the NFA and
    the pattern API: they import it, it imports none of them; the SQL parser imports no NFA."""
    g = graph()
    cep = "ctiflow.operators.cep."
    for name, deps in g.items():
        if name.startswith(cep + "expr."):
            assert {d for d in deps if d.startswith(cep) and not d.startswith(cep + "expr.")} == set(), name
    assert {d for d in g[cep + "sql.parse"] if d.startswith(cep)} <= {cep + "expr.tree", cep + "expr.vocabulary"}


#: STYLE.md: lines that fit a side-by-side review (~100–110 characters).
LINE_LIMIT = 110


def test_the_product_s_lines_fit_a_side_by_side_review():
    """Every line of ``jobs/`` and ``operators/`` within :data:`LINE_LIMIT` characters, but a
    Markdown table row of a docstring (it must stay on one line) and a line whose one string
    literal is a single unbreakable name (a Java class)."""
    long_lines = []
    for name, path in modules().items():
        if top(name) not in ("jobs", "operators"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if len(line) <= LINE_LIMIT or line.lstrip().startswith("|"):
                continue
            if re.fullmatch(r'\s*[A-Z_]+ = "[\w.$]+"', line):
                continue
            long_lines.append(f"{path.relative_to(ROOT)}:{number} ({len(line)})")
    assert long_lines == []
