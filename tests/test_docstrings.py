"""Docstrings name the code as it is: the site publishes them (the architecture page's module map,
the Python API page), so a module that moved must not be named at its old place.

Checked: every `simtune.x.y` in a docstring, and every backticked `x.y` whose first part is the
last part of a simtune module's name (`metrics.Ranker`, `cache.vectors`), names a module of
`src/simtune` or `stages`, or a name one of them defines (a function, class, constant, `__all__`
entry; a class's member one step further). Not module names, and so skipped: params keys (or a
run of their parts: `lora.r` of `train.lora.r`), file names (`meta.json`) and strings the
code itself writes (the Arrow metadata key `simtune.hidden`). And every logger of the package is
`logging.getLogger(__name__)`, so a log line names the module that wrote it.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator

from simtune import params as P
from tests.conftest import ROOT

PACKAGES = (ROOT / "src" / "simtune", ROOT / "stages")
DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"json", "jsonl", "yaml", "yml", "parquet", "arrow", "tsv", "csv", "txt", "md",
                 "py", "pt", "trec", "safetensors", "onnx", "bin", "toml", "lock", "html", "svg",
                 "db"}


@functools.cache
def modules() -> dict[str, ast.Module]:
    """Every module of the packages by dotted name (`simtune.cache.vectors`), parsed."""
    out = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = ast.parse(path.read_text())
    return out


def _defined(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body defines itself (imports excluded), and its `__all__`."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            if (any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
                    and isinstance(node.value, (ast.List, ast.Tuple))):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


def resolves(dotted: str, module: str) -> bool:
    """`dotted` is module `module` (a full dotted name) or a name it defines, then a member of
    that name when it is a class."""
    if dotted == module:
        return True
    rest = dotted.removeprefix(module + ".").split(".")
    body: list[ast.stmt] = modules()[module].body
    for part in rest:
        if part not in _defined(body):
            return False
        cls = [n for n in body if isinstance(n, ast.ClassDef) and n.name == part]
        if not cls:
            return True  # a function or constant: what follows is beyond a docstring's check
        body = cls[0].body
    return True


def known(name: str) -> bool:
    """`name` read against every module it may start with: `simtune.a.b` and `stages.a` are
    absolute; `a.b.c` starts with any module whose name ends with `.a.b` or `.a`."""
    parts = name.split(".")
    absolute = parts[0] in ("simtune", "stages")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        tail = ".".join(parts[i:])
        for module in modules():
            starts = module == head or (not absolute and module.endswith("." + head))
            if starts and resolves(f"{module}.{tail}" if tail else module, module):
                return True
    return False


@functools.cache
def params_keys() -> list[list[str]]:
    return [key.split(".") for key, _ in P.documented_keys()]


def is_params_key(name: str) -> bool:
    """`name` is a run of consecutive parts of a params key (`<name>` matches any part)."""
    parts = name.split(".")
    for key in params_keys():
        for start in range(len(key) - len(parts) + 1):
            if all(k in ("<name>", p) for k, p in zip(key[start:], parts, strict=False)):
                return True
    return False


@functools.cache
def code_strings() -> frozenset[str]:
    """Every string (and bytes) constant of the packages' code: docstrings and logger names
    excluded (a logger named after a module is no evidence that the module exists)."""
    skip = {id(d) for _, _, d in _docstring_nodes()}
    out = set()
    for tree in modules().values():
        skip |= {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "getLogger"
                 for a in n.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in skip:
                if isinstance(node.value, bytes):
                    out.add(node.value.decode(errors="replace"))
                elif isinstance(node.value, str):
                    out.add(node.value)
    return frozenset(out)


def _docstring_nodes() -> Iterator[tuple[str, int, ast.Constant]]:
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)):
                    yield module, first.lineno, first.value


def named_modules() -> Iterator[tuple[str, int, str]]:
    """(module, line, dotted name) for every dotted name a docstring gives as code's."""
    leaves = {m.rsplit(".", 1)[-1] for m in modules()}
    for module, line, node in _docstring_nodes():
        text = node.value
        names = [n for n in DOTTED.findall(text) if n.split(".")[0] in ("simtune", "stages")]
        for span in re.findall(r"`([^`]+)`", text):
            names += [n for n in DOTTED.findall(span) if n.split(".")[0] in leaves]
        for name in dict.fromkeys(names):
            if (name.rsplit(".", 1)[-1] in FILE_SUFFIXES or name in code_strings()
                    or is_params_key(name)):
                continue
            yield module, line, name


def unresolved() -> list[str]:
    return [f"{module} (docstring at line {line}): `{name}`"
            for module, line, name in named_modules() if not known(name)]


def test_every_module_a_docstring_names_exists() -> None:
    names = [name for _, _, name in named_modules()]
    assert len(names) >= 40  # the check reads the docstrings it is meant to read
    assert unresolved() == []


def test_the_check_tells_a_moved_module_from_a_params_key_or_a_file() -> None:
    # today's places, absolute or relative, modules and the names they define
    for name in ("simtune.cache.vectors", "retrieval.topk", "cache.vectors", "metrics.Ranker",
                 "validation.Schedule.full", "simtune.load_model", "stages.cache"):
        assert known(name), name
    # the flat layout's names (`metrics.topk`: `topk` is only imported there)
    for name in ("simtune.shared", "simtune.represent", "metrics.topk", "simtune.cache.nothing",
                 "validation.Schedule.nothing"):
        assert not known(name), name
    assert is_params_key("train.lora") and is_params_key("schedule.top_layers.layers")
    assert is_params_key("lora.r") and not is_params_key("train.encoder.lora")
    assert is_params_key("encoders.models.minilm.pooling")
    assert not is_params_key("cache.vectors")
    assert "simtune.hidden" in code_strings() and "simtune.shared" not in code_strings()


def _logger_calls(tree: ast.Module) -> Iterator[tuple[ast.Call, ast.AST | None]]:
    """Every `logging.getLogger(...)` call, with the node it is used by (an attribute access such
    as `.setLevel`) when it is not assigned."""
    parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"):
            yield node, parents.get(id(node))


def test_every_logger_of_the_package_is_named_after_its_module() -> None:
    """`getLogger(__name__)`; a literal name only for another library's logger, or to set the
    level of the whole package's (`simtune`)."""
    wrong = []
    for module, tree in modules().items():
        for call, parent in _logger_calls(tree):
            arg = call.args[0] if call.args else None
            if isinstance(arg, ast.Name) and arg.id == "__name__":
                continue
            literal = arg.value if isinstance(arg, ast.Constant) else None
            ours = isinstance(literal, str) and literal.split(".")[0] in ("simtune", "stages")
            sets_level = isinstance(parent, ast.Attribute) and parent.attr == "setLevel"
            if literal is None or (ours and not (literal == "simtune" and sets_level)):
                wrong.append(f"{module}:{call.lineno}: getLogger({ast.unparse(call.args)})")
    assert wrong == []
    named = sum(1 for tree in modules().values() for call, _ in _logger_calls(tree)
                if call.args and isinstance(call.args[0], ast.Name))
    assert named >= 20
