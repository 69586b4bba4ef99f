"""The layer rules of docs/architecture.md hold: import-linter's contracts in pyproject.toml (layers point down, no
Qt below the app, no import cycles), checked over an installed copy of the package (where ui/, devices/ and
configs/ sit inside hg_dagger, as in a wheel); and no module uses another's private names."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess]

REPO = Path(__file__).resolve().parent.parent


def _lint(site: Path) -> subprocess.CompletedProcess:
    linter = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(linter), "--config", str(site / "pyproject.toml")], capture_output=True, text=True,
                          cwd=site, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=300)


_CYCLES = """
import grimp
g = grimp.build_graph("hg_dagger", cache_dir=None)
for a in sorted(g.modules):
    for b in sorted(g.find_modules_directly_imported_by(a)):
        chain = g.find_shortest_chain(importer=b, imported=a) if b.startswith("hg_dagger") else None
        if chain:
            print(" -> ".join((a, *chain)))
"""


def _cycles(site: Path) -> list[str]:
    """Every import cycle through our modules, package __init__ modules included (which acyclic_siblings, comparing
    siblings only, does not see: a module importing its own package), one line per import that closes one."""
    out = subprocess.run([sys.executable, "-c", _CYCLES], capture_output=True, text=True, check=True, cwd=site,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=300)
    return out.stdout.splitlines()


def test_import_contracts_hold_and_catch_an_upward_import(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(REPO)], check=True, capture_output=True, timeout=300)
    shutil.copy(REPO / "pyproject.toml", site / "pyproject.toml")
    kept = _lint(site)
    assert kept.returncode == 0, kept.stdout[-4000:] + kept.stderr[-2000:]
    assert "4 kept, 0 broken" in kept.stdout
    assert _cycles(site) == []

    # the same check on a copy where the store reaches up into the session: it must fail and name the import
    low = site / "hg_dagger" / "store" / "trainable.py"
    low.write_text(low.read_text() + "\nfrom hg_dagger.control import session as _upward  # noqa\n")
    broken = _lint(site)
    assert broken.returncode != 0
    assert "hg_dagger.store.trainable -> hg_dagger.control.session" in broken.stdout
    assert "No cycles are allowed in hg_dagger." in broken.stdout  # store -> control -> store, between packages


def test_import_cycles_are_caught(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(REPO)], check=True, capture_output=True, timeout=300)
    shutil.copy(REPO / "pyproject.toml", site / "pyproject.toml")
    # the segment reads the store that reads it: a cycle inside hg_dagger.store, no layer crossed
    low = site / "hg_dagger" / "store" / "segment.py"
    low.write_text(low.read_text() + "\n\ndef _cycle():\n    from hg_dagger.store import store  # noqa\n")
    broken = _lint(site)
    assert broken.returncode != 0
    assert "No cycles are allowed in hg_dagger.store." in broken.stdout
    assert "Layers point down" in broken.stdout and "KEPT" in broken.stdout
    # a module importing its own package's __init__, which imports it: no siblings involved, the graph walk finds it
    student = site / "hg_dagger" / "policy" / "student.py"
    student.write_text(student.read_text() + "\n\ndef _cycle():\n    import hg_dagger.policy  # noqa\n")
    cycles = _cycles(site)
    assert any(c.startswith("hg_dagger.policy.student -> hg_dagger.policy -> ") for c in cycles), cycles
    assert any("hg_dagger.store.segment" in c and "hg_dagger.store.store" in c for c in cycles), cycles


# ---------------------------------------------------------------------- private names stay in their module

def _source_roots() -> dict[str, Path]:
    """setup.py's package -> folder mapping (hg_dagger, ui/ -> hg_dagger.ui, devices/ -> hg_dagger.devices)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    roots = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROOTS")
    return {name: REPO / folder for name, folder in roots.items()}


def _modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the roots (a nested root wins over its parent)."""
    found: dict[str, Path] = {}
    for name, folder in sorted(roots.items(), key=lambda kv: len(kv[0])):
        for f in sorted(folder.rglob("*.py")):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = f
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_crossings(roots: dict[str, Path]) -> list[str]:
    """``from X import _name`` and ``X._name`` where X is another of our modules, as "module:line what"."""
    modules = _modules(roots)
    top = sorted(roots, key=len)[0]
    found = []
    for mod, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        bound: dict[str, str] = {}  # a local name bound to one of our modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module or "") if p)
                if source not in modules:
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif _private(alias.name) and source != mod:
                        found.append(f"{mod}:{node.lineno} from {source} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.asname:  # import a.b as x: x is a.b
                        bound[alias.asname] = alias.name
                    elif alias.name in modules:  # import a.b: a is bound, a.b reached through it
                        bound[alias.name.partition(".")[0]] = top
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                target = ".".join([bound[value.id], *reversed(chain)])
                if target in modules and target != mod:
                    found.append(f"{mod}:{node.lineno} {target}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    crossings = private_crossings(_source_roots())
    assert not crossings, "private names used outside their module (make them public or move them):\n" + \
        "\n".join(crossings)


def test_private_crossings_are_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("_hidden = 1\n\n\ndef _helper():\n    return _hidden\n")
    (pkg / "sub" / "high.py").write_text(
        "import pkg.low as low_mod\nfrom pkg import low\nfrom .. import low as again\nfrom pkg.low import _hidden\n"
        "from ..low import _helper as h\n\nx = low._helper() + low_mod._hidden + again._hidden + _hidden + h()\n")
    (pkg / "sub" / "fine.py").write_text("from pkg.low import __doc__\nfrom pkg import low\n\ny = low.__name__\n")
    found = private_crossings({"pkg": pkg})
    assert sorted(f.partition(" ")[2] for f in found) == sorted([
        "from pkg.low import _hidden", "from pkg.low import _helper",
        "pkg.low._helper", "pkg.low._hidden", "pkg.low._hidden"])
    assert all(f.startswith("pkg.sub.high:") for f in found)


# ---------------------------------------------------------------------- modules with one job stay small

MAX_MODULE_LINES = 600  # docs/architecture.md: a module over this does more than one job; split it


def long_modules(roots: dict[str, Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    """Library modules over ``limit`` lines, as "module: N lines"."""
    found = []
    for mod, path in sorted(_modules(roots).items()):
        n = len(path.read_text().splitlines())
        if n > limit:
            found.append(f"{mod}: {n} lines")
    return found


def test_no_library_module_is_over_the_line_limit():
    too_long = long_modules(_source_roots())
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + "\n".join(too_long)


def test_long_modules_are_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 10)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 11)
    assert long_modules({"pkg": tmp_path / "pkg"}, limit=10) == ["pkg.long: 11 lines"]


# ---------------------------------------------------------------------- one tick function steps every mode

STEPPERS = {  # the modules that may call a VecEnv's step (docs/architecture.md): the engine and the env's own seams
    "hg_dagger.control.engine", "hg_dagger.review.replay", "hg_dagger.envs.check", "hg_dagger.envs.bridge.robot",
    "hg_dagger.envs.embodichain",  # wraps EmbodiChain's own env
    "hg_dagger.envs.rewind",  # re-runs an episode's recorded actions in one row, as replay does (rewind and correct)
}


def env_steps(roots: dict[str, Path]) -> list[str]:
    """Calls of ``env.step(...)`` / ``self.env.step(...)`` outside the modules allowed to step an env."""
    found = []
    for mod, path in sorted(_modules(roots).items()):
        if mod in STEPPERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"):
                continue
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name in ("env", "bare_env", "vec_env"):
                found.append(f"{mod}:{node.lineno}")
    return found


def test_only_the_engine_steps_an_env():
    stray = env_steps(_source_roots())
    assert not stray, "env.step outside the engine (route the rollout through control.engine.Engine):\n" + \
        "\n".join(stray)


def test_a_stray_env_step_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "loop.py").write_text("def go(self, a):\n    return self.env.step(a)\n")
    (tmp_path / "pkg" / "other.py").write_text("def go(opt):\n    opt.step()\n")
    assert env_steps({"pkg": tmp_path / "pkg"}) == ["pkg.loop:2"]


# ---------------------------------------------------------------------- imports at the top, where a reader sees them

# A function-level import of one of our modules hides the dependency graph; each one left is deliberate, for a reason.
_TORCH = "loads torch (seconds)"
_ZARR_CLI = "loads zarr; the CLI imports every command module to list its commands"
_TORCH_CLI = "loads torch; the CLI imports every command module to list its commands"
_QT = "loads Qt (the app extra)"
_EVAL = "loads the run config, session, operators, experts or devices, which eval must not (tests/learn/test_eval.py)"
_PYGAME = "loads pygame (the app extra)"
_HID = "loads hid (the app extra); without it there is no SpaceMouse, not an error"

DEFERRED_IMPORTS = {  # "importer -> imported": why it stays inside a function
    "hg_dagger.cli.app -> hg_dagger.control.run_config": _EVAL,
    "hg_dagger.control.gate_novelty -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.cli.app -> hg_dagger.ui.application": _QT,
    "hg_dagger.cli.devices -> hg_dagger.devices": _EVAL,
    "hg_dagger.cli.devices -> hg_dagger.devices.base": _EVAL,
    "hg_dagger.cli.devices -> hg_dagger.devices.tools": _EVAL,
    "hg_dagger.cli.export -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.cli.learn -> hg_dagger.learn.aggregate": _ZARR_CLI,
    "hg_dagger.cli.learn -> hg_dagger.learn.auto": _TORCH_CLI,
    "hg_dagger.cli.learn -> hg_dagger.learn.train": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy.lerobot_served": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy.server": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy.sources": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy.remote": _TORCH_CLI,
    "hg_dagger.cli.policy -> hg_dagger.policy.wire": _TORCH_CLI,
    "hg_dagger.learn.lerobot_round -> hg_dagger.policy.lerobot_served": _TORCH,  # the app starts its jobs
    "hg_dagger.learn.lerobot_round -> hg_dagger.policy.remote": _TORCH,
    "hg_dagger.learn.lerobot_round -> hg_dagger.policy.sources": _TORCH,
    "hg_dagger.cli.qc -> hg_dagger.review.qc": _ZARR_CLI,
    "hg_dagger.cli.report -> hg_dagger.learn.train": _TORCH_CLI,
    "hg_dagger.cli.report -> hg_dagger.review.report": _ZARR_CLI,
    "hg_dagger.cli.review -> hg_dagger.review.decisions": _ZARR_CLI,
    "hg_dagger.cli.run -> hg_dagger.control.build": _ZARR_CLI,
    "hg_dagger.cli.run -> hg_dagger.control.run_config": _EVAL,
    "hg_dagger.cli.run -> hg_dagger.learn.auto": _TORCH_CLI,
    "hg_dagger.cli.run -> hg_dagger.policy": _TORCH_CLI,
    "hg_dagger.cli.run -> hg_dagger.store.layout": _ZARR_CLI,
    "hg_dagger.cli.store -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.control.build -> hg_dagger.policy": _TORCH,
    "hg_dagger.control.engine -> hg_dagger.experts": "student-only rollouts never import the experts",
    "hg_dagger.control.loop -> hg_dagger.policy": _TORCH,
    "hg_dagger.datasets.read -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.datasets.read -> hg_dagger.store.trainable": _ZARR_CLI,
    "hg_dagger.datasets.report -> hg_dagger.review.report": _ZARR_CLI,
    "hg_dagger.datasets.source -> hg_dagger.store.trainable": _ZARR_CLI,
    "hg_dagger.demo -> hg_dagger.control.build": _EVAL,
    "hg_dagger.demo -> hg_dagger.control.run_config": _EVAL,
    "hg_dagger.demo -> hg_dagger.learn.auto": _TORCH_CLI,
    "hg_dagger.demo -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.devices.discovery -> hg_dagger.devices.gamepad": _PYGAME,
    "hg_dagger.devices.discovery -> hg_dagger.devices.spacemouse": _HID,
    "hg_dagger.experts.policy -> hg_dagger.policy": _TORCH,
    "hg_dagger.learn.budget -> hg_dagger.control.run_config": _EVAL,
    "hg_dagger.learn.collect -> hg_dagger.experts": _EVAL,
    "hg_dagger.learn.collect -> hg_dagger.experts.base": _EVAL,
    "hg_dagger.learn.evaluate -> hg_dagger.learn.train": _TORCH_CLI,
    "hg_dagger.learn.evaluate -> hg_dagger.policy": _TORCH_CLI,
    "hg_dagger.learn.evaluate -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.learn.evaluate -> hg_dagger.store.trainable": _ZARR_CLI,
    "hg_dagger.learn.executor -> hg_dagger.control.build": _EVAL,
    "hg_dagger.learn.executor_ray -> hg_dagger.control.session": _EVAL,
    "hg_dagger.learn.executor_ray -> hg_dagger.policy.checkpoint": _TORCH_CLI,
    "hg_dagger.learn.executor_ray -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.learn.executor_worker -> hg_dagger.control.build": _EVAL,
    "hg_dagger.learn.executor_worker -> hg_dagger.learn.collect": _EVAL,
    "hg_dagger.learn.executor_worker -> hg_dagger.policy.checkpoint": _TORCH_CLI,
    "hg_dagger.learn.executor_worker -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.learn.gate_calibration -> hg_dagger.control.run_config": _EVAL,
    "hg_dagger.learn.gate_calibration -> hg_dagger.policy": _TORCH,
    "hg_dagger.learn.gate_calibration -> hg_dagger.policy.checkpoint": _TORCH,
    "hg_dagger.learn.rounds -> hg_dagger.learn.auto": _TORCH,
    "hg_dagger.learn.rounds -> hg_dagger.learn.round_promotion": _TORCH,
    "hg_dagger.learn.rounds -> hg_dagger.learn.train": _TORCH,
    "hg_dagger.learn.rounds -> hg_dagger.policy": _TORCH,
    "hg_dagger.review.replay -> hg_dagger.store": _ZARR_CLI,
    "hg_dagger.ui.application -> hg_dagger.policy": _TORCH,
    "hg_dagger.ui.review_main -> hg_dagger.review.decisions": _ZARR_CLI,
    "hg_dagger.ui.review_main -> hg_dagger.ui.lifetime": _QT,
    "hg_dagger.ui.review_main -> hg_dagger.ui.review": _QT,
}


def _imported(node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]) -> list[str]:
    """The modules an import statement names (``from a import b`` names a.b when that is a module, else a)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
    source = ".".join(p for p in (base, node.module or "") if p)
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]


def hidden_imports(roots: dict[str, Path]) -> dict[str, list[int]]:
    """Imports of our own modules inside a function, as {"importer -> imported": [lines]}."""
    modules = _modules(roots)
    top = sorted(roots, key=len)[0]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    found: dict[str, list[int]] = {}
    for mod, path in sorted(modules.items()):
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        stack: list[tuple[ast.AST, bool]] = [(ast.parse(path.read_text(), str(path)), False)]
        while stack:
            node, in_function = stack.pop()
            if in_function and isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, package, modules):
                    if target == top or target.startswith(top + "."):
                        found.setdefault(f"{mod} -> {target}", []).append(node.lineno)
            stack += [(child, in_function or isinstance(node, functions)) for child in ast.iter_child_nodes(node)]
    for lines in found.values():
        lines.sort()
    return found


def test_imports_of_our_modules_sit_at_the_top_unless_deferred_for_a_reason():
    hidden = hidden_imports(_source_roots())
    new = sorted(f"{pair} (line {', '.join(map(str, lines))})" for pair, lines in hidden.items()
                 if pair not in DEFERRED_IMPORTS)
    assert not new, ("imports of our modules inside a function (move them to the top of the module; or, when the "
                     "module they load pulls torch, zarr, Qt or a simulator into a module that must stay light, "
                     "add them to DEFERRED_IMPORTS with the reason and say it in a comment):\n" + "\n".join(new))
    stale = sorted(set(DEFERRED_IMPORTS) - set(hidden))
    assert not stale, "DEFERRED_IMPORTS entries no longer deferred (remove them):\n" + "\n".join(stale)


def test_a_hidden_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("import json\n\nx = 1\n")
    (pkg / "sub" / "high.py").write_text(
        "from pkg import low\n\n\ndef f():\n    import json\n    from .. import low as again\n    return again.x\n\n\n"
        "class C:\n    def g(self):\n        from pkg.sub import other\n        return lambda: __import__('os')\n")
    (pkg / "sub" / "other.py").write_text("def h():\n    import pkg.low\n    return pkg.low.x\n")
    assert hidden_imports({"pkg": pkg}) == {"pkg.sub.high -> pkg.low": [6], "pkg.sub.high -> pkg.sub.other": [12],
                                            "pkg.sub.other -> pkg.low": [2]}
