"""The package's layout: imports flow one way, down the layers, and never in a cycle.

The layers, lowest first (a module may import its own layer and the ones below):

- base: ``errors``, ``signals``, ``_version``
- ``timing/``: slot clocks, cron, schedules, the catch-up policy (no Redis, no app)
- settings: ``config``, ``entries``
- ``store/``: the store's interfaces and the Redis store (connection, keys, Lua scripts,
  lease, ledger, events, requests, entries, the guard's records, the CLI's admin)
- ``send/``: the send path (a chunk of granted slots to the broker), its optimisations
- ``roles/``: leader, standby and what they share
- ``ops/``, ``integrations/`` and ``web/``: the command line, the cluster view,
  telemetry; the gate around another scheduler, the worker guard; the web view
- ``scheduler``: the Celery glue
- ``contrib/``: the web view in other projects' interfaces (Django's admin)
- the public face: the package itself and the ``guard``/``cluster`` re-exports
- ``demo/``: the failover demo, built on all of it

Imports under ``if TYPE_CHECKING:`` are for the type checker only and not counted.

Above the store, ``send/``, ``roles/`` and ``ops/`` reach Redis only through the store's
interfaces (``store/base.py``): they import no ``redis``
module, but for claim-and-enqueue in one step (``send/one_step.py``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import celery_leaderbeat

# the package as imported: the source tree, or an installed wheel (CI tests both)
PACKAGE = Path(celery_leaderbeat.__file__).resolve().parent
NAME = "celery_leaderbeat"

LAYERS: list[set[str]] = [
    {"errors", "signals", "_version"},
    {"timing"},
    {"config", "entries"},
    {"store"},
    {"send"},
    {"roles"},
    {"ops", "integrations", "web"},
    {"scheduler"},
    {"contrib"},
    {"__init__", "guard", "cluster"},
    {"demo"},
]


def layer_of(module: str) -> int:
    """The layer of a dotted module name (``celery_leaderbeat.store.lease`` -> store's)."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    for index, members in enumerate(LAYERS):
        if head in members:
            return index
    raise AssertionError(f"{module}: no layer for {head!r}; add it to LAYERS")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (at any depth: top, function, class)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from X import name``: name may be a module of package X
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != module)
    return found


@functools.cache  # parsed once: three tests read it, none changes it
def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_the_package_and_its_imports():
    edges = graph()
    assert "celery_leaderbeat.store.lease" in edges
    assert "celery_leaderbeat.store.keys" in edges["celery_leaderbeat.store.lease"]
    assert "celery_leaderbeat.roles.leader" in edges["celery_leaderbeat.scheduler"]


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{name} -> {target}" for name, targets in graph().items()
                    for target in targets if layer_of(target) > layer_of(name))
    assert upward == []


def test_no_import_cycle():
    assert _cycle(graph()) is None


#: the one module above the store that may import Redis: claim-and-enqueue in one step hands
#: kombu's Redis commands to the claim (an optional capability of the Redis store)
REDIS_ALLOWED = {"celery_leaderbeat.send.one_step"}


def redis_imports(path: Path) -> list[str]:
    """The ``redis`` modules ``path`` imports: ``redis``, ``redis.x``, ``from x import redis``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "redis"]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "redis":
                found.append(node.module or "")
            found += [f"{node.module}.{a.name}" for a in node.names if a.name == "redis"]
    return found


def test_the_send_path_the_roles_and_the_cli_reach_redis_only_through_the_store():
    direct = sorted(f"{name}: {module}" for name, path in modules().items()
                    if name.split(".")[1:2] in (["send"], ["roles"], ["ops"])
                    and name not in REDIS_ALLOWED
                    for module in redis_imports(path))
    assert direct == []


def test_the_redis_import_finder_finds_each_form(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import redis\nfrom redis.exceptions import RedisError\n"
                      "from kombu.transport import redis as r\nimport json\n")
    assert redis_imports(source) == ["redis", "redis.exceptions", "kombu.transport.redis"]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
