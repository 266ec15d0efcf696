"""The folders show the architecture: arrows run one way and there is no circle.

core (protocol, tiling, frames, distarray, wire, tokens, errors, settings, lenient, regrid, palette, kept, grants,
passwords, and query/functions: the table of what the nodes compute, which the wire validates against) <- query <- io
<- server |
client <- runtimes | local <- bench <- entry points (the package itself, the CLI).
Every import counts, also those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"flightpart": ROOT / "flightpart", "flightpart.server": ROOT / "server",
           "flightpart.client": ROOT / "client"}
CORE = {"protocol", "tiling", "frames", "distarray", "wire", "sqlwire", "tokens", "errors", "settings", "version",
        "lenient", "palette", "regrid", "kept", "grants", "passwords"}
CORE_MODULES = {"flightpart.query.functions"}
"""Modules of a folder above the core that belong to it: they import nothing but the core."""
ENTRY = {"flightpart", "flightpart.__main__"}
LAYER = {"core": 0, "query": 1, "io": 2, "server": 3, "client": 3, "sql": 4, "runtimes": 5, "local": 5, "bench": 6,
         "cli": 7, "entry": 8}
RUNTIME_FAMILY = {"dask": "dask", "dask_cluster": "dask", "ray": "ray", "ray_cluster": "ray", "spmd": "spmd",
                  "tasks": "tasks"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if package == "flightpart" and parts and parts[0] in ("server", "client"):
                continue
            found[".".join([package, *parts])] = path
    return found


def group(module: str) -> str:
    if module in ENTRY:
        return "entry"
    if module in CORE_MODULES:
        return "core"
    parts = module.split(".")
    if parts[1] in CORE:
        return "core"
    return parts[1]


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours that ``module`` imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from x import y` imports the module x.y when there is one, else a name of x
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_the_layout_has_the_rooms_the_design_names():
    mods = set(modules())
    for expected in ["flightpart.protocol", "flightpart.tiling", "flightpart.wire", "flightpart.errors",
                     "flightpart.io.access", "flightpart.io.connections", "flightpart.io.transfer",
                     "flightpart.io.layout", "flightpart.io.inprocess", "flightpart.local.cluster",
                     "flightpart.local.embedded", "flightpart.cli.demo", "flightpart.cli.errors",
                     "flightpart.cli.daemons", "flightpart.cli.datasets", "flightpart.cli.bench",
                     "flightpart.bench.run", "flightpart.bench.scale", "flightpart.query.filters",
                     "flightpart.query.apply", "flightpart.query.pruning", "flightpart.query.functions",
                     "flightpart.runtimes.tasks", "flightpart.server.daemon", "flightpart.server.base",
                     "flightpart.client.plugins"]:
        assert expected in mods, expected
    assert (ROOT / "flightpart" / "py.typed").exists()


def test_arrows_run_one_way():
    wrong = []
    for source, targets in graph().items():
        for target in targets:
            a, b = group(source), group(target)
            if a == b:
                if a == "runtimes":
                    fa, fb = RUNTIME_FAMILY[source.split(".")[-1]], RUNTIME_FAMILY.get(target.split(".")[-1], "tasks")
                    if fa != fb and fb != "tasks":
                        wrong.append(f"{source} -> {target} (one runtime imports another)")
                continue
            if LAYER[b] >= LAYER[a]:
                wrong.append(f"{source} ({a}) -> {target} ({b})")
    assert wrong == []


def test_the_core_does_no_io():
    forbidden = {"socket", "psutil", "grpc", "platformdirs", "subprocess", "sqlite3"}
    for module, path in modules().items():
        if group(module) != "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & forbidden, f"{module} imports {names}"


def test_there_is_no_circle():
    g = graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert circles == []


OUR_MODULE_NAMES = {"protocol", "tiling", "frames", "wire", "client", "server", "layout", "transfer", "fp", "filters",
                    "statistics", "distarray", "tokens", "errors"}
"""Names our modules are imported as: ``frames._x`` is another module's private even where a ``_x`` exists here."""
THIRD_PARTY_PRIVATE = {"_call", "_name"}
"""Private names of other projects used on purpose: ``pc.Expression._call`` builds a call to any compute function
(pyarrow has no public constructor for one); dask-expr's ``Expr._name`` is an expression's identity, which a read
taking Dask's filters compares with the frame the predicate's columns come from, as Dask's own read_parquet does."""
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe"}
"""Standard library names that start with an underscore and are public (namedtuple's, ``os._exit``)."""


def _defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines or binds: functions, classes, variables, arguments, imports, attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
    return names


def test_no_private_name_is_used_across_modules():
    """A private name is used only in the module that defines it: another module (or a test) that needs it gets a
    public seam. This covers ``module._name`` and ``obj._name`` / ``self.x._name`` alike: an attribute whose name
    starts with one underscore and that the using module never defines is someone else's private."""
    sources = {**modules(), **{f"tests.{p.relative_to(ROOT / 'tests').with_suffix('')}": p
                               for p in (ROOT / "tests").rglob("*.py")}}
    leaks = []
    for module, path in sources.items():
        tree = ast.parse(path.read_text())
        defined = _defined_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                leaks += [f"{module} imports {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                of_a_module = isinstance(node.value, ast.Name) and node.value.id in OUR_MODULE_NAMES
                if of_a_module or node.attr not in defined | THIRD_PARTY_PRIVATE | PUBLIC_UNDERSCORED:
                    leaks.append(f"{module}:{node.lineno} uses {ast.unparse(node)}")
    assert leaks == []



NODE_CONCERNS = {"catalog_link", "integrity", "puts", "gets", "actions"}
"""The node's concerns: each imports ``shared`` and none of the others (a call between them goes through ``self``)."""
STORE_ORDER = ["paths", "tombstones", "integrity", "reads", "cleanup", "writes", "partition_store"]
"""The store's modules in the order they may import one another: each only those before it."""


def _inside(g: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The modules of ``flightpart.server.<package>`` (by short name) and which of them each imports."""
    prefix = f"flightpart.server.{package}."
    return {m.removeprefix(prefix): {t.removeprefix(prefix) for t in targets if t.startswith(prefix)}
            for m, targets in g.items() if m.startswith(prefix)}


def test_node_and_store_are_packages_cut_by_concern():
    """``server/node/`` and ``server/store/`` are packages of small modules, one concern each (none over 400
    lines), whose imports run one way: the node's concerns import only ``shared`` and ``server`` composes them;
    the store's modules import only those before them in :data:`STORE_ORDER`; only the server uses the store."""
    g, mods = graph(), modules()
    node, store = _inside(g, "node"), _inside(g, "store")
    assert set(node) == {"shared", "server", *NODE_CONCERNS} and set(store) == set(STORE_ORDER)
    for package in ("node", "store"):
        assert not (ROOT / "server" / f"{package}.py").exists()
        for module, path in mods.items():
            if module.startswith(f"flightpart.server.{package}"):
                lines = len(path.read_text().splitlines())
                assert lines <= 400, f"{module} has {lines} lines"
    assert node["shared"] == set()
    for concern in NODE_CONCERNS:
        assert node[concern] <= {"shared"}, f"node.{concern} imports {node[concern]}"
    assert node["server"] == NODE_CONCERNS
    for k, name in enumerate(STORE_ORDER):
        assert store[name] <= set(STORE_ORDER[:k]), f"store.{name} imports {store[name] - set(STORE_ORDER[:k])}"
    users = {m for m, targets in g.items() if any(t.startswith("flightpart.server.store") for t in targets)}
    assert {m for m in users if not m.startswith("flightpart.server.")} == set()
SQL_SERVER_SIDE = {"server", "answers", "sending", "prepared", "listing", "metadata", "puts", "statuses"}
"""The modules of flightpart/sql/ that speak Flight SQL to clients; the rest is the gateway and its planners."""
SQL_PLANNING = {"planners", "pushed", "pushed_join", "computed", "inlined", "scans", "partials", "parsed", "collected",
                "explained", "names"}
"""The modules that decide and run what a query's answer is made of: they know nothing of the gateway or of calls."""


def test_the_sql_service_is_a_gateway_of_planners_behind_a_flight_sql_server():
    """flightpart/sql/ is the catalog's SQL service: ``server`` (Flight SQL calls, dispatched by message type) over
    ``gateway`` (a query run through the ordered ``planners``). Each module stays under 400 lines; only the package
    imports the server, only the server the gateway; the planning modules import neither, nor anything of the
    server's side, and only the server's side reads Flight SQL's messages. One name per thing: no module here shares
    its name with one of flightpart/query/ (the filter-predicate language is ``query.predicates``)."""
    folder = ROOT / "flightpart" / "sql"
    names = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert {"gateway", "planners", "server"} | SQL_SERVER_SIDE | SQL_PLANNING <= names
    for path in folder.glob("*.py"):
        assert len(path.read_text().splitlines()) < 400, path.name
    wrong = []
    for source, targets in graph().items():
        if not source.startswith("flightpart.sql."):
            continue
        mine = source.rsplit(".", 1)[1]
        ours = {t.rsplit(".", 1)[1] for t in targets if t.startswith("flightpart.sql.")}
        if "server" in ours:
            wrong.append(f"{source} imports the server")
        if "gateway" in ours and mine != "server":
            wrong.append(f"{source} imports the gateway")
        if mine in SQL_PLANNING and ours & SQL_SERVER_SIDE:
            wrong.append(f"{source} imports {sorted(ours & SQL_SERVER_SIDE)}")
        if mine not in SQL_SERVER_SIDE and "flightpart.sqlwire" in targets:
            wrong.append(f"{source} reads Flight SQL's messages")
    assert wrong == []
    query = {p.stem for p in (ROOT / "flightpart" / "query").glob("*.py")} - {"__init__"}
    assert "predicates" in query and "sql" not in query
    assert names & query == set()
CATALOG_PARTS = {"leadership", "registry", "versions", "repair", "publish", "reads", "access"}
STATE_ARROWS = {"records": set(), "database": set(), "tables": {"records", "database"}, "core": {"database", "tables"},
                "nodes": {"core", "database", "records", "tables"},
                "versions": {"core", "database", "records", "tables"},
                "access": {"core", "database"},
                "composed": {"nodes", "versions", "access"}}
"""Which module of the catalog's state may import which (none imports the catalog)."""


def test_the_catalog_and_its_state_are_packages_cut_by_concern():
    """``server/catalog/`` and ``server/state/``: one module per concern, none over 400 lines. A catalog part imports
    no other part (only ``orders``, the base of all, and ``lease``); only ``server`` composes them. The state's
    modules import one way (:data:`STATE_ARROWS`) and never the catalog."""
    mods, g = modules(), graph()
    catalog, state = "flightpart.server.catalog", "flightpart.server.state"
    assert {f"{catalog}.{m}" for m in CATALOG_PARTS | {"server", "orders", "lease"}} | {catalog} <= set(mods)
    assert {f"{state}.{m}" for m in STATE_ARROWS} | {state} <= set(mods)
    for module, path in mods.items():
        if module.startswith((catalog, state)):
            assert len(path.read_text().splitlines()) <= 400, f"{module} is over 400 lines"

    def within(module: str, package: str) -> set[str]:
        return {t.rpartition(".")[2] for t in g[module] if t.startswith(package + ".")}

    for part in CATALOG_PARTS:
        assert within(f"{catalog}.{part}", catalog) <= {"orders", "lease"}, part
    assert within(f"{catalog}.orders", catalog) <= {"lease"}
    assert within(f"{catalog}.lease", catalog) == set()
    assert within(f"{catalog}.server", catalog) == CATALOG_PARTS | {"lease"}
    assert g[catalog] == {f"{catalog}.server"}
    for name, allowed in STATE_ARROWS.items():
        module = f"{state}.{name}"
        assert within(module, state) <= allowed, module
        assert not {t for t in g[module] if t == catalog or t.startswith(catalog + ".")}, module
    assert g[state] == {f"{state}.composed"}


def test_daemon_settings_are_values_the_commands_are_made_from():
    """A daemon's settings are frozen values (``server/settings.py``, ``Security`` in ``server/security.py``) that
    import no click; ``serve`` and ``catalog`` get every option from them through ``cli/options.py`` and spell none
    themselves, so a setting is written once. The modules stay small."""
    g, mods = graph(), modules()
    settings, security = "flightpart.server.settings", "flightpart.server.security"
    assert {settings, security, "flightpart.cli.options"} <= set(mods)
    assert {t for t in g[settings] if t.startswith("flightpart.server.")} == {security}
    assert {t for t in g[security] if t.startswith("flightpart.server.")} <= {"flightpart.server.auth"}
    for module in (settings, security, "flightpart.server.daemon", "flightpart.cli.options"):
        lines = len(mods[module].read_text().splitlines())
        assert lines <= 400, f"{module} has {lines} lines"
    for module, path in mods.items():
        if module.startswith("flightpart.server."):
            tree = ast.parse(path.read_text())
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert "click" not in imported, f"{module} imports click"
    commands = {f.name: f for f in ast.walk(ast.parse(mods["flightpart.cli.daemons"].read_text()))
                if isinstance(f, ast.FunctionDef) and f.name in ("serve", "catalog_cmd")}
    for name, function in commands.items():
        made = [ast.unparse(d) for d in function.decorator_list]
        assert len(made) == 2 and made[1].startswith("options_of("), f"{name} is decorated with {made}"
        assert function.args.kwarg is not None and not function.args.args, f"{name} spells its own parameters"


CLUSTER_CLASSES = {"LocalCluster", "InProcessCluster"}


def direct_clusters(tests: Path) -> list[str]:
    """Where a test file outside ``conftest.py`` constructs a flightpart ``LocalCluster`` or ``InProcessCluster``
    itself (``file:line``); Dask's ``distributed.LocalCluster`` and scripts held in strings are not ours."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.name == "conftest.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        ours = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("flightpart") for a in n.names if a.name in CLUSTER_CLASSES}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            named = isinstance(f, ast.Name) and f.id in ours
            dotted = (isinstance(f, ast.Attribute) and f.attr in CLUSTER_CLASSES
                      and not (isinstance(f.value, ast.Name) and f.value.id == "distributed"))
            if named or dotted:
                found.append(f"{path.relative_to(tests.parent)}:{node.lineno}")
    return found


def pinned_ranges(tests: Path) -> set[int]:
    """The literal ``first_ip=`` of every ``make_cluster(...)`` / ``new_cluster(...)`` call in the tests."""
    pins = set()
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("make_cluster", "new_cluster"):
                pins |= {k.value.value for k in node.keywords
                         if k.arg == "first_ip" and isinstance(k.value, ast.Constant)}
    return pins


def test_every_test_cluster_comes_from_the_conftest_factory():
    """Tests get clusters from ``make_cluster`` / ``new_cluster`` (``tests/conftest.py``), whose session-wide pool
    gives each a loopback range of its own; a test that built one itself picked its addresses by hand, and two
    such picks could collide. A pinned range (``first_ip=``) is one of conftest's ``PINNED``, which automatic
    ranges avoid."""
    tests = ROOT / "tests"
    assert direct_clusters(tests) == []
    conftest = ast.parse((tests / "conftest.py").read_text())
    declared = next(n.value for n in conftest.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "PINNED" for t in n.targets))
    assert isinstance(declared, ast.Call) and declared.args, "PINNED is frozenset({...})"
    pinned = ast.literal_eval(declared.args[0])
    assert pinned_ranges(tests) <= pinned, f"pinned outside conftest's PINNED: {pinned_ranges(tests) - pinned}"
