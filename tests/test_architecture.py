"""The package's shape, checked on its source: no import circle (``TYPE_CHECKING`` imports
count: a type-only import is still a dependency a reader must hold in their head), layers that
import only from the layers above them (docs/architecture.md's list), no module that reaches
into another's private (``_name``) names, module state said where it is kept, and an
architecture page that names only code that exists. File length is a note, not a rule: a file
holds one concept, whatever its length (STYLE.md), so a long one is only pointed out."""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import rankwise
from helpers.paths import REPO

ROOT = Path(rankwise.__file__).parent
# The layers of docs/architecture.md, top first: a module may import from its own layer and the ones above.
# validation.py holds the input checks every layer words alike; testing/ drives the trainer.
LAYERS = [
    "validation", "distributed", "storage", "data", "augment", "parallel", "train", "launch",
    "models", "testing", "compat", "demo", "cli",
]  # fmt: skip
# train/'s packages by concept (docs/architecture.md), each with the train modules it may not
# import: the config is read and checked without the engine (nothing of train but itself); the
# sinks and the audit are handed rows and records, never the loop that makes them.
_THE_LOOP = ("rankwise.train.trainer", "rankwise.train.loop", "rankwise.train.step")
TRAIN_PACKAGES: dict[str, tuple[str, ...]] = {
    "rankwise.train.config": ("rankwise.train.",),
    "rankwise.train.tracking": _THE_LOOP,
    "rankwise.train.audit": _THE_LOOP,
    "rankwise.train.checkpoint": _THE_LOOP,
}
LONG_FILE = 600  # lines: past this a file is pointed out, never failed
# docs/architecture.md: only distributed/environment.py and the distributed/config/ package
# read the environment (a folder ends in "/": every module in it).
ENV_READERS = {"distributed/environment.py", "distributed/config/"}
# Reads allowed elsewhere, each with its reason. Keep it empty: a setting is a field of a config
# object in distributed/ (e.g. MemberConfig.join_check_every), which other layers are given.
ENV_READS_ALLOWED: dict[str, str] = {}
# Modules that keep mutable state of the process (a ``global`` statement, a module-level mutable
# container, an ``lru_cache``) must say where and why in a "Module state:" paragraph of their
# docstring; these are allowed without one for now, each with its reason.
MODULE_STATE_UNDESCRIBED: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The rankwise modules ``name`` imports. ``from pkg import sub`` depends on ``pkg.sub``
    when that is a module (not on ``pkg``'s ``__init__``), as import linters count it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            out |= {s for s in subs if s in modules}
            if any(s not in modules for s in subs):
                out.add(base)
    return {m for m in out if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package() -> None:
    graph = _graph()
    assert len(graph) > 50  # the scan sees the package
    assert "rankwise.train.state" in graph["rankwise.train.trainer"]
    assert _cycles(graph) == []


def test_layers_import_only_from_the_layers_above() -> None:
    graph = _graph()
    wrong = []
    for name, deps in graph.items():
        layer = name.split(".")[1] if name.count(".") else None
        if layer not in LAYERS:
            continue
        allowed = LAYERS[: LAYERS.index(layer) + 1]
        for dep in deps:
            dep_layer = dep.split(".")[1] if dep.count(".") else None
            if dep_layer in LAYERS and dep_layer not in allowed:
                wrong.append(f"{name} imports {dep}")
    assert wrong == []


def test_train_packages_import_only_what_their_concept_needs() -> None:
    graph = _graph()
    wrong = []
    for package, refused in TRAIN_PACKAGES.items():
        members = [name for name in graph if name == package or name.startswith(package + ".")]
        assert len(members) > 1, f"{package} is a package of several modules"
        for name in members:
            for dep in graph[name]:
                inside = dep == package or dep.startswith(package + ".")
                if not inside and any(dep.startswith(prefix) for prefix in refused):
                    wrong.append(f"{name} imports {dep}")
    assert wrong == []


def _private_imports(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``from rankwise.x import _y`` and imports of a ``_private`` module from outside its own
    package: each is a name its owner did not offer."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            if not base.startswith("rankwise"):
                continue
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            found += [f"{name} imports {base}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("rankwise")]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if _private(part) and not name.startswith(owner + ".") and target in modules:
                    found.append(f"{name} imports the private module {target}")
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_private_import_scan_finds_one(tmp_path: Path) -> None:
    source = tmp_path / "rankwise" / "data" / "weighted.py"
    source.parent.mkdir(parents=True)
    source.write_text("from rankwise.data.permutation import _mix, public\n")
    modules = {"rankwise.data.weighted": source, "rankwise.data.permutation": source}
    assert _private_imports("rankwise.data.weighted", source, modules) == [
        "rankwise.data.weighted imports rankwise.data.permutation._mix"
    ]
    source.write_text("from rankwise.data.permutation import public\n")
    assert _private_imports("rankwise.data.weighted", source, modules) == []


def test_no_module_imports_a_private_name_of_another() -> None:
    modules = _modules()
    found = [f for name, path in modules.items() for f in _private_imports(name, path, modules)]
    assert found == []


def test_long_files_are_pointed_out_not_failed() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in ROOT.rglob("*.py")
    }
    assert len(sizes) > 50
    long = {k: v for k, v in sizes.items() if v > LONG_FILE}
    if long:  # a note for the reader of the test report: is each still one concept?
        warnings.warn(f"files over {LONG_FILE} lines (one concept each?): {long}", stacklevel=1)


def _env_uses(source: str) -> list[tuple[int, str]]:
    """``(line, kind)`` for every use of the environment in ``source``: kind ``read`` (one
    variable's value, or an alias that hides what is read), ``write`` (set, change, delete) or
    ``copy`` (the whole environment handed on, e.g. to a child process's ``env``).

    Reads: ``os.getenv(...)``, ``os.environ.get(...)``, ``os.environ[...]`` loaded, ``"X" in
    os.environ``, ``setdefault`` / ``pop`` whose result is used, and any other use of
    ``os.environ`` (``env = os.environ`` reads through the alias later).
    """
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    os_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names if a.name == "os"}  # fmt: skip
    from_os = {a.asname or a.name: a.name for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.module == "os" for a in n.names}  # fmt: skip

    def names(node: ast.AST, what: str) -> bool:  # os.<what>, or <what> imported from os
        if isinstance(node, ast.Attribute) and node.attr == what:
            return isinstance(node.value, ast.Name) and node.value.id in os_names
        return isinstance(node, ast.Name) and from_os.get(node.id) == what

    def kind(node: ast.AST) -> str:
        parent = parents[node]
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return "read" if isinstance(parent.ctx, ast.Load) else "write"
        if isinstance(parent, ast.Attribute) and isinstance(parents[parent], ast.Call):
            call = parents[parent]
            if parent.attr in ("update", "clear"):
                return "write"
            if parent.attr in ("setdefault", "pop"):  # a write unless its answer is used
                return "write" if isinstance(parents[call], ast.Expr) else "read"
            if parent.attr in ("copy", "items"):
                return "copy"
            return "read"  # get, and anything else
        if isinstance(parent, ast.Compare) and node in parent.comparators:
            return "read"  # "X" in os.environ
        if isinstance(parent, ast.Dict) and None in parent.keys:
            return "copy"  # {**os.environ, ...}
        if isinstance(parent, ast.keyword) and parent.arg is None:
            return "copy"  # f(**os.environ)
        is_dict = isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
        if is_dict and parent.func.id == "dict" and node in parent.args:
            return "copy"  # dict(os.environ)
        return "read"

    found = []
    for node in ast.walk(tree):
        if names(node, "getenv") and isinstance(parents.get(node), ast.Call):
            found.append((node.lineno, "read"))
        elif names(node, "environ"):
            found.append((node.lineno, kind(node)))
    return sorted(found)


def _within(name: str, places: set[str]) -> bool:
    """Whether module ``name`` (``distributed/config/member.py``) is one of ``places``: a file,
    or a folder (ending in "/") that holds it."""
    return any(name == p or (p.endswith("/") and name.startswith(p)) for p in places)


def test_the_environment_scan_tells_reads_from_writes() -> None:
    source = """
import os
from os import environ as env_alias
a = os.environ.get("A"); b = os.getenv("B"); c = os.environ["C"]; d = "D" in os.environ
e = os.environ; f = env_alias["F"]; g = os.environ.setdefault("G", "1")
os.environ["H"] = "1"; del os.environ["H"]; os.environ.setdefault("I", "1"); os.environ.update({})
child = {**os.environ, "RANK": "0"}; saved = dict(os.environ); os.environ.pop("J", None)
"""
    uses = _env_uses(source)
    assert [line for line, kind in uses if kind == "read"] == [4, 4, 4, 4, 5, 5, 5]
    assert [kind for line, kind in uses if line == 6] == ["write"] * 4
    assert [kind for line, kind in uses if line == 7] == ["copy", "copy", "write"]


def test_only_distributed_config_and_environment_read_the_environment() -> None:
    reads: dict[str, list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = [n for n, kind in _env_uses(path.read_text(encoding="utf-8")) if kind == "read"]
        if lines:
            reads[name] = lines

    # the scan sees the reads where they belong: in each reader, file or folder
    assert all(any(name == r or name.startswith(r) for name in reads) for r in ENV_READERS)
    elsewhere = {name: lines for name, lines in reads.items() if not _within(name, ENV_READERS)}
    assert elsewhere.keys() == ENV_READS_ALLOWED.keys(), (
        f"environment variables read outside {sorted(ENV_READERS)}: {elsewhere}; make the "
        "setting a field of a config object in rankwise/distributed/config/ and pass it on"
    )


# Continue mode's contract: its variables and store keys are spelt in one module, which the
# launcher and the members both import (STYLE.md 11); the config package reads them by name.
CONTRACT = "distributed/contract.py"
_KEY_PREFIXES = ("gen/", "join/", "challenge/", "proof/", "refused/", "admit/", "exit/",
                 "joinbeat/", "hb/", "member/", "dead/", "launch/", "auth/", "fit/")  # fmt: skip
_KEY_WORDS = {"current", "waiting", "stopped"}


def _contract_literals(source: str) -> list[str]:
    """The string literals of ``source`` that spell a name of continue mode's contract: a
    ``RANKWISE_*`` variable, or a store key (an f-string or string that starts like one, or
    one of the bare keys) used as a value; docstrings and messages are sentences, not names."""
    from rankwise.distributed import contract

    variables = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
    variables = {v for v in variables if v.startswith("RANKWISE_")}
    tree = ast.parse(source)
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in parts:
            continue  # a piece of an f-string: the f-string is judged whole
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            head = first.value if isinstance(first, ast.Constant) else ""
            if isinstance(head, str) and head.startswith(_KEY_PREFIXES):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            key = text.startswith(_KEY_PREFIXES) and " " not in text
            if text in variables or key or text in _KEY_WORDS:
                found.append(repr(text))
    return sorted(found)


def test_the_contract_scan_finds_a_spelt_name() -> None:
    source = 'a = {"RANKWISE_SLOT": "1"}; b = f"dead/{s}"; c = "waiting"; d = "gen/0/members"\n'
    source += 'e = "the slot waiting (RANKWISE_SLOT)"; f = f"a member/{s} sentence"\n'
    assert _contract_literals(source) == ["'RANKWISE_SLOT'", "'gen/0/members'", "'waiting'",
                                          "f'dead/{s}'"]  # fmt: skip


def test_continue_modes_names_are_spelt_only_in_its_contract() -> None:
    spelt = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name != CONTRACT and (found := _contract_literals(path.read_text(encoding="utf-8"))):
            spelt[name] = found
    assert _contract_literals((ROOT / CONTRACT).read_text(encoding="utf-8"))  # sees them there
    assert spelt == {}, "use rankwise.distributed.contract's names (its Keys, its variables)"


# A blocking store read (``wait`` for keys, ``check`` then ``get``, ``multi_get``) is allowed
# only on keys that nothing reads with a compare-and-set: on torch's libuv server such a read
# of a missing key wakes every waiter of it (docs/continue.md), and a key deleted between
# ``check`` and ``get`` holds the reader for the store's whole timeout. rendezvous.py waits on
# its own counters, which only it writes; testing/'s clients are the attackers and their targets.
BLOCKING_READS_ALLOWED = {"distributed/rendezvous.py", "testing/"}


def _blocking_store_reads(source: str) -> list[int]:
    """The lines of ``source`` that call a store's blocking read: ``x.wait([...])``,
    ``x.check([...])`` (a list of keys, not an Event's, a process's or futures' ``wait``),
    ``x.multi_get``. A list passed by name is not seen: write the keys where they are read."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if ast.unparse(node.func.value).split(".")[-1] in ("futures", "asyncio"):
            continue  # concurrent.futures.wait([...]): futures, not keys
        keys = bool(node.args) and isinstance(node.args[0], ast.List | ast.ListComp | ast.Tuple)
        if node.func.attr == "multi_get" or (node.func.attr in ("wait", "check") and keys):
            found.append(node.lineno)
    return sorted(found)


def test_the_blocking_read_scan_tells_a_store_from_an_event() -> None:
    source = """
store.wait(["a"]); store.wait([k for k in keys], timeout); store.check(["a"]); s.multi_get(x)
stop.wait(0.2); proc.wait(); store.wait(keys); done.check()
concurrent.futures.wait([a, b], timeout=1); asyncio.wait([t])
"""
    assert _blocking_store_reads(source) == [2, 2, 2, 2]


def test_no_protocol_key_is_read_with_a_read_that_can_wait() -> None:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not _within(name, BLOCKING_READS_ALLOWED) and (
            lines := _blocking_store_reads(path.read_text(encoding="utf-8"))
        ):
            found[name] = lines
    assert _blocking_store_reads((ROOT / "distributed/rendezvous.py").read_text(encoding="utf-8"))
    assert found == {}, (
        "read a protocol key with rankwise.distributed.signing.read_raw (never waits)"
    )


def _membership_reads(source: str) -> list[int]:
    """The lines of ``source`` that call ``membership()`` (``rd.membership()`` or the bare name)."""
    return sorted(
        node.lineno for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).split(".")[-1] == "membership" and not node.args
    )  # fmt: skip


def test_the_training_layer_asks_the_fits_roles_never_the_membership() -> None:
    # fit builds one rankwise.distributed.Roles and hands it on (docs/architecture.md)
    assert _membership_reads("import rankwise.distributed as rd\nm = rd.membership()\n") == [2]
    found = {
        path.relative_to(ROOT).as_posix(): lines
        for path in sorted((ROOT / "train").rglob("*.py"))
        if (lines := _membership_reads(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "take a rankwise.distributed.Roles (fit's) instead of rd.membership()"


def _module_state(source: str) -> list[str]:
    """The names of the mutable process state a module keeps: names a ``global`` statement
    rebinds, module-level mutable containers (lowercase names: an uppercase one is a constant),
    ``functools.lru_cache`` / ``cache`` memos."""
    tree = ast.parse(source)
    found = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    containers = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    factories = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter",
                 "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}  # fmt: skip
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            call = isinstance(value, ast.Call)
            made = call and ast.unparse(value.func).split(".")[-1] in factories
            mutable = isinstance(value, containers) or made
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else ""
                if mutable and name and name != "__all__" and not name.isupper():
                    found.add(name)
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                text = ast.unparse(deco)
                if "lru_cache" in text or text.endswith("cache"):
                    found.add(node.name)
    return sorted(found)


def test_the_module_state_scan_finds_globals_containers_and_caches() -> None:
    source = """
import functools
_count = 0
_seen: set[str] = set()
NAMES = ["a"]
__all__ = ["f"]
def f():
    global _count
    _count += 1
@functools.lru_cache(maxsize=4)
def g(x): return x
"""
    assert _module_state(source) == ["_count", "_seen", "g"]


def test_modules_with_mutable_state_say_where_and_why() -> None:
    holders = {}
    for name, path in _modules().items():
        source = path.read_text(encoding="utf-8")
        if state := _module_state(source):
            holders[name] = state
    assert "rankwise.distributed.group" in holders  # the scan sees the known holders
    modules = _modules()

    def described(name: str) -> bool:
        doc = ast.get_docstring(ast.parse(modules[name].read_text(encoding="utf-8")))
        return "Module state:" in (doc or "")

    silent = {
        name: state
        for name, state in holders.items()
        if name not in MODULE_STATE_UNDESCRIBED and not described(name)
    }
    assert silent == {}, "say where and why in a 'Module state:' paragraph of the docstring"
    assert set(MODULE_STATE_UNDESCRIBED) <= set(holders)  # an entry that has no state goes


# -- docs/architecture.md names only what exists ---------------------------------------------

ARCHITECTURE_PAGE = REPO / "docs" / "architecture.md"
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"^rankwise(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PATH = re.compile(r"^(src|tests|benchmarks|examples|docs|scripts)/[\w./-]*$")


def _resolves(dotted: str) -> bool:
    """``rankwise.x.y.Name``: the longest importable module, then attributes of it."""
    return _resolves_in(dotted)


def _cited(text: str) -> tuple[list[str], list[str]]:
    """The dotted ``rankwise...`` names and the repository paths a page cites in code spans
    and in its ```text diagrams (a name there is a word of the picture)."""
    spans = _CODE_SPAN.findall(text)
    words = [w.strip("(),:;") for w in re.findall(r"rankwise(?:\.\w+)+", text)]
    names = sorted({s for s in [*spans, *words] if _DOTTED.match(s)})
    paths = sorted({s.split("::")[0] for s in spans if _PATH.match(s.split("::")[0])})
    return names, paths


def test_the_citation_scan_finds_names_and_paths() -> None:
    text = "`rankwise.data.sampler.DistributedSampler` in `src/rankwise/data/` (`x.y`)\n" + (
        "  run_epoch   rankwise.train.loop\n`tests/test_docs.py::test_site`"
    )
    names, paths = _cited(text)
    assert names == ["rankwise.data.sampler.DistributedSampler", "rankwise.train.loop"]
    assert paths == ["src/rankwise/data/", "tests/test_docs.py"]
    assert _resolves("rankwise.data.sampler.DistributedSampler")
    assert not _resolves("rankwise.data.sampler.NoSuchSampler")
    assert not _resolves("rankwise.no_such_package")


_BARE = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")
# Words of the page that are neither rankwise's nor torch's names: a command, dunder, a test's.
_NOT_CODE = {"torchrun", "rankwise", "__init__", "_private", "LAYERS", "TRAIN_PACKAGES"}


def _defined_names() -> set[str]:
    """Every class, function and assigned or annotated name in rankwise's source."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
            elif isinstance(node, ast.Assign):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def _torch_has(name: str) -> bool:
    if name.startswith("torch."):
        return _resolves_in(name)
    places = ("torch", "torch.distributed", "torch.amp", "torch.nn.parallel")
    extra = ("torch.distributed.fsdp",)
    return any(_resolves_in(f"{place}.{name}") for place in (*places, *extra))


def _resolves_in(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_the_architecture_page_names_only_code_that_exists() -> None:
    """A bare name in a code span (``wrap_model``, ``DistributedTrainer.fit``) is rankwise's
    (defined somewhere in its source, attribute by attribute) or torch's."""
    spans = set(_CODE_SPAN.findall(ARCHITECTURE_PAGE.read_text(encoding="utf-8")))
    bare = {s for s in spans if _BARE.match(s) and not s.startswith("rankwise.")} - _NOT_CODE
    assert len(bare) > 10
    defined = _defined_names()
    unknown = sorted(s for s in bare if not set(s.split(".")) <= defined and not _torch_has(s))
    assert unknown == [], f"docs/architecture.md names {unknown}, found in neither"


def test_the_architecture_page_cites_only_names_and_paths_that_exist() -> None:
    names, paths = _cited(ARCHITECTURE_PAGE.read_text(encoding="utf-8"))
    assert len(names) > 20 and len(paths) > 3  # the scan sees the page's citations
    missing = [n for n in names if not _resolves(n)]
    absent = [p for p in paths if not (REPO / p).exists()]
    assert missing == [] and absent == [], f"docs/architecture.md cites {missing + absent}"
