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
  telemetry; wrapping another scheduler, the worker guard; the web view
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


def imports_of(module: str, path: Path, known: set[str], *, types: bool = False) -> set[str]:
    """The package modules ``module`` imports (at any depth: top, function, class); with
    ``types``, those imported for the type checker only too."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if types else _type_checking_only(tree)
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


def test_no_import_cycle_nor_upward_import_for_the_type_checker_either():
    """A cycle of imports under ``if TYPE_CHECKING:`` still ties two modules together: a
    reader must know both to change either."""
    found = modules()
    edges = {name: imports_of(name, path, set(found), types=True) for name, path in found.items()}
    assert _cycle(edges) is None
    assert sorted(f"{name} -> {target}" for name, targets in edges.items()
                  for target in targets if layer_of(target) > layer_of(name)) == []


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


def private_names_defined(tree: ast.Module) -> set[str]:
    """The private names a module gives its own objects: ``def _x``, ``class _X``,
    ``self._x = ...`` and ``_x: T`` in a class body."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            found.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return {name for name in found if name.startswith("_") and not name.startswith("__")}


def _reached(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(object, name) of ``obj.name`` or ``getattr(obj, "name", ...)``, else None."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        return node.args[0], node.args[1].value
    return None


def private_reaches(module: str, tree: ast.Module, owners: dict[str, set[str]]) -> list[str]:
    """``obj._x`` (or ``getattr(obj, "_x")``) in ``module`` where ``obj`` is not
    ``self``/``cls`` and only modules of another layer define ``_x``: a reach past that
    layer's public face."""
    own = {name for name, defined in owners.items()
           if module in defined or any(layer_of(m) == layer_of(module) for m in defined)}
    found = []
    for node in ast.walk(tree):
        reached = _reached(node)
        if reached is None:
            continue
        obj, name = reached
        if name in owners and name not in own \
                and not (isinstance(obj, ast.Name) and obj.id in ("self", "cls")):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)} "
                         f"(defined in {', '.join(sorted(owners[name]))})")
    return found


def test_no_module_reaches_into_a_private_attribute_of_another_layer():
    """The roles reach the Celery side through their port (``roles/port.py``), never through
    a Scheduler's private attribute; no layer reaches into another's privates."""
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules().items()}
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for private in private_names_defined(tree):
            owners.setdefault(private, set()).add(name)
    reaches = [reach for name, tree in trees.items()
               for reach in private_reaches(name, tree, owners)]
    assert reaches == []


def test_the_private_reach_finder_finds_a_role_reaching_into_the_scheduler():
    owners = {"_entry_options": {"celery_leaderbeat.scheduler"}}
    tree = ast.parse("def f(scheduler):\n    return scheduler._entry_options, self._entry_options\n")
    reach = ("celery_leaderbeat.roles.leader:2: scheduler._entry_options "
             "(defined in celery_leaderbeat.scheduler)")
    assert private_reaches("celery_leaderbeat.roles.leader", tree, owners) == [reach]
    assert private_reaches("celery_leaderbeat.scheduler", tree, owners) == []
    tree = ast.parse("def f(scheduler):\n    return getattr(scheduler, '_entry_options', None)\n")
    by_name = ("celery_leaderbeat.roles.leader:2: getattr(scheduler, '_entry_options', None) "
               "(defined in celery_leaderbeat.scheduler)")
    assert private_reaches("celery_leaderbeat.roles.leader", tree, owners) == [by_name]


#: the longest a function of the package may be (lines, its docstring included): one a
#: newcomer reads in one sitting; ruff's C901 and too-many-branches/statements bound the rest
MAX_FUNCTION_LINES = 60
#: the longest a Lua file may be (a script, or a prelude piece the loader puts before
#: some): one a newcomer reads in one sitting, the prelude counted apart from each script
MAX_SCRIPT_LINES = 120


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (n lines)`` of every function under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                                 f"({lines} lines)")
    return found


def test_no_function_of_the_package_is_longer_than_a_screen():
    assert long_functions(PACKAGE, MAX_FUNCTION_LINES) == []


def test_the_length_finder_finds_a_long_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 70)
    assert long_functions(pkg, MAX_FUNCTION_LINES) == ["pkg/m.py:5 long (71 lines)"]


def test_no_lua_script_is_longer_than_its_limit():
    scripts = sorted((PACKAGE / "store" / "lua").glob("*.lua"))
    assert scripts
    assert [f"{s.name} ({n} lines)" for s in scripts
            if (n := len(s.read_text().splitlines())) > MAX_SCRIPT_LINES] == []
