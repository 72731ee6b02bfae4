"""A registry of one extension point, declared by decorators beside the code and read without importing it.

An implementation is registered by decorating it in its own module:

    @POLICY_LOSSES.register("gspo", doc="PPO clip on the sequence-level ratio")
    def gspo_policy_loss(...): ...

The decorator's arguments are literals; without a `doc` argument the spec's doc is the first paragraph of
the object's docstring. The arguments are literals (constants, tuples, dicts, module-level string constants of the same
file, `+` of strings), so the registry reads every entry's spec from the source text (the AST) of the files
under its package folders (or files): asking which names exist and what each can do (the config validation does)
imports neither the implementation nor torch. When the module is imported, the same decorator binds the
object to its name and checks that it matches the spec read from the source (one declaration, two readers).

Files named in $VERL_NPU_PLUGINS are read like the package's own (their entries get short names). A
user's own policy loss or estimator may also be named by its file: `path/to/file.py:function`. Its spec is read from that
file the same way (the decorator if the object has one; otherwise the spec's defaults and the docstring's
first line), and `load` imports the file by path.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from verl_npu.errors import UserError

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # verl_npu/
FILE_SEPARATOR = ".py:"
PLUGINS_VARIABLE = "VERL_NPU_PLUGINS"

S = TypeVar("S", bound="Spec")
T = TypeVar("T")


class RegistryError(UserError, ValueError):
    """A name no registry entry has, a file entry that cannot be read, or two declarations of one name
    (a user's error: the CLI prints it without a traceback)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """What every registered implementation has: its name, where it lives ("module:attribute", or
    "path/file.py:attribute" for a user's file) and one line on what it is."""

    name: str
    target: str
    doc: str = ""


def is_file_entry(name: str) -> bool:
    """`name` names a user's file (`path/file.py:attribute`), not a registered name."""
    return FILE_SEPARATOR in str(name)


class _Literal(ast.NodeVisitor):
    """Evaluates a decorator argument: literals, module-level literal constants of the same file, `+`."""

    def __init__(self, constants: dict[str, Any]):
        self.constants = constants

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in self.constants:
            return self.constants[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left) + self.value(node.right)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise ValueError("a ** in a dict is not a literal")
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values) if k is not None}
        return ast.literal_eval(node)


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    constants: dict[str, Any] = {}
    reader = _Literal(constants)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    constants[target.id] = reader.value(value)
                except (ValueError, TypeError, SyntaxError):
                    pass
    return constants


class Registry(Generic[S]):
    """One extension point: `handle` is the variable the decorators use (`@HANDLE.register(...)`), `key`
    the config key that names an entry, `folders` the package folders whose files declare entries."""

    def __init__(
        self,
        handle: str,
        what: str,
        key: str,
        spec_type: type[S],
        folders: tuple[str, ...],
        unsupported: Iterable[str] = (),
        user_files: bool = False,
    ):
        self.handle, self.what, self.key, self.spec_type = handle, what, key, spec_type
        self.folders = folders
        self.unsupported = tuple(unsupported)
        self.user_files = user_files  # whether `path/file.py:attribute` may name an entry
        self.implementations: dict[str, Any] = {}
        self._specs: dict[str, S] | None = None
        self._file_specs: dict[str, S] = {}
        self._file_objects: dict[str, Any] = {}  # users' file entries, apart from the registered names

    # ---- the specs, read from the source -------------------------------------------------------
    def _source_files(self) -> list[Path]:
        files: list[Path] = []
        for folder in self.folders:  # a file named first puts its entries first (the order of the docs)
            path = PACKAGE_ROOT / folder
            found = [path] if path.is_file() else sorted(path.rglob("*.py"), key=lambda p: (p.stem != "core", str(p)))
            files += [f for f in found if f not in files]
        return files + plugin_files()

    def _declarations(self, path: Path, module: str, attribute: str | None = None) -> list[S]:
        """The specs the decorators `@<handle>.register(...)` in `path` declare (only the one on
        `attribute` with it)."""
        text = path.read_text(encoding="utf-8")
        if attribute is None and f"{self.handle}.register(" not in text:
            return []
        tree = ast.parse(text, filename=str(path))
        reader = _Literal(_module_constants(tree))
        found = []
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                continue
            if attribute is not None and node.name != attribute:
                continue
            declared = [d for d in node.decorator_list if isinstance(d, ast.Call) and self._is_register(d.func)]
            for call in declared:
                args = [reader.value(a) for a in call.args]
                if any(k.arg is None for k in call.keywords):
                    raise ValueError(f"a ** argument in @{self.handle}.register is not a literal")
                fields = {str(k.arg): reader.value(k.value) for k in call.keywords}
                name = args[0] if args else fields.pop("name")
                if "doc" not in fields:  # the docstring's first paragraph says what it is
                    fields["doc"] = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
                found.append(self.spec_type(name=name, target=f"{module}:{node.name}", **fields))
            if attribute is not None and not declared:  # a user's undecorated function: defaults, its docstring
                doc = (ast.get_docstring(node) or "").strip().split("\n")[0]
                found.append(self.spec_type(name=f"{module}:{node.name}", target=f"{module}:{node.name}", doc=doc))
        return found

    def _is_register(self, func: ast.AST) -> bool:
        """`HANDLE.register` or `<module>.HANDLE.register`."""
        if not (isinstance(func, ast.Attribute) and func.attr == "register"):
            return False
        owner = func.value
        return (isinstance(owner, ast.Name) and owner.id == self.handle) or (
            isinstance(owner, ast.Attribute) and owner.attr == self.handle
        )

    def user_files_allowed(self, name: str) -> bool:
        """`name` is a user's `path/file.py:attribute` and this registry takes those."""
        return self.user_files and is_file_entry(name)

    @property
    def specs(self) -> dict[str, S]:
        """name -> spec of every built-in entry, in the order of their files and lines."""
        if self._specs is None:
            specs: dict[str, S] = {}
            for path in self._source_files():
                inside = path.is_relative_to(PACKAGE_ROOT)
                module = ".".join(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts) if inside else str(path)
                for spec in self._declarations(path, module.removesuffix(".__init__")):
                    if spec.name in specs:
                        raise RegistryError(
                            f"{self.what} {spec.name!r} is registered twice: {specs[spec.name].target} "
                            f"and {spec.target}"
                        )
                    specs[spec.name] = spec
            self._specs = specs
        return self._specs

    def names(self) -> tuple[str, ...]:
        return tuple(self.specs)

    def find(self, name: Any) -> S | None:
        """The spec of a registered name, or None (for code that runs before the config is validated)."""
        return self.specs.get(str(name))

    def spec(self, name: str) -> S:
        """The spec of a registered name, or of a user's `path/file.py:attribute` (read from that file)."""
        name = str(name)
        if name in self.specs:
            return self.specs[name]
        if self.user_files_allowed(name):
            return self.file_spec(name)
        raise RegistryError(
            f"unknown {self.what} {name!r} ({self.key}); registered: {', '.join(self.specs)}"
            + ("; or your own as path/to/file.py:name" if self.user_files else "")
        )

    def file_problem(self, name: str) -> str | None:
        """What is wrong with a user's `path/file.py:attribute` entry, or None."""
        try:
            self.file_spec(name)
        except RegistryError as err:
            return str(err)
        return None

    def file_spec(self, name: str) -> S:
        if name not in self._file_specs:
            file, _, attribute = name.rpartition(":")
            path = Path(file).expanduser()
            if not path.is_file():
                raise RegistryError(
                    f"{self.key}={name}: no file {path} (give the path of a .py file and the name "
                    "of the function in it: path/to/file.py:function)"
                )
            try:
                found = self._declarations(path, str(path), attribute)
            except SyntaxError as err:
                raise RegistryError(f"{self.key}={name}: {path} is not valid Python: {err}") from None
            except (ValueError, TypeError) as err:
                raise RegistryError(
                    f"{self.key}={name}: the arguments of @{self.handle}.register in {path} must be literals: {err}"
                ) from None
            if not found:
                raise RegistryError(f"{self.key}={name}: {path} defines no top-level {attribute!r}")
            self._file_specs[name] = dataclasses.replace(found[0], name=name)
        return self._file_specs[name]

    # ---- the implementations -------------------------------------------------------------------
    def register(self, name: str, **fields: Any) -> Callable[[T], T]:
        """Declares `name` with its spec fields (literals: the registry reads them from the source) and,
        when the module is imported, binds the decorated object to it."""

        def bind(obj: T) -> T:
            module = getattr(obj, "__module__", "")
            declared = self._bound_spec(name, module, obj)
            for field, value in fields.items():
                if getattr(declared, field) != (tuple(value) if isinstance(value, list) else value):
                    raise RegistryError(
                        f"{self.what} {name!r}: {field}={value!r} differs from what the source "
                        f"declares ({getattr(declared, field)!r}): use literals in @{self.handle}"
                        ".register"
                    )
            if not self._declares(name, module, obj):
                return obj  # a user's file named by path: `load` binds it under that entry, never a registered name
            known = self.implementations.get(declared.name)
            if (
                known is not None
                and known is not obj
                and getattr(known, "__qualname__", None) != getattr(obj, "__qualname__", None)
            ):
                raise RegistryError(f"{self.what} {declared.name!r} is registered twice")
            self.implementations[declared.name] = obj
            return obj

        return bind

    def _declares(self, name: str, module: str, obj: Any) -> bool:
        """Whether `name`'s registered entry (a built-in or a $VERL_NPU_PLUGINS file's) is this very object."""
        spec = self.specs.get(name)
        if spec is None:
            return False
        file = getattr(sys.modules.get(module), "__file__", None)
        return spec.target in (
            f"{module}:{obj.__qualname__}",
            f"{Path(file).resolve()}:{obj.__qualname__}" if file else None,
        )

    def _bound_spec(self, name: str, module: str, obj: Any) -> S:
        if name in self.specs and self.specs[name].target == f"{module}:{obj.__qualname__}":
            return self.specs[name]
        file = getattr(sys.modules.get(module), "__file__", None)
        if file is not None:  # a user's file (or a test's), loaded by path
            for spec in self._declarations(Path(file), str(file), obj.__qualname__):
                if spec.name == name:
                    return spec
        raise RegistryError(
            f"{self.what} {name!r}: {module}.{obj.__qualname__} is not declared where the registry "
            f"reads ({', '.join(self.folders)} under verl_npu/, or a user's file)"
        )

    def load(self, name: str) -> Any:
        """The implementation of `name` (imports its module, or the user's file, on first use)."""
        spec = self.spec(name)
        module, _, attribute = spec.target.rpartition(":")
        if is_file_entry(spec.target):
            if spec.name not in self._file_objects:
                self._file_objects[spec.name] = getattr(load_file(module), attribute)
            return self._file_objects[spec.name]
        if spec.name not in self.implementations:
            importlib.import_module(module)
        if spec.name not in self.implementations:  # declared, but the module did not bind it
            self.implementations[spec.name] = getattr(sys.modules[module], attribute)
        return self.implementations[spec.name]

    def check_bound(self) -> list[str]:
        """Imports every built-in entry's module; the names declared but not bound, or bound to another
        object than the declaration's target (a test asserts none)."""
        problems = []
        for name, spec in self.specs.items():
            module, _, attribute = spec.target.rpartition(":")
            if is_file_entry(spec.target):  # a plugin file: bound when loaded
                continue
            importlib.import_module(module)
            obj = self.implementations.get(name)
            if obj is None or obj is not getattr(sys.modules[module], attribute):
                problems.append(f"{self.what} {name}: declared at {spec.target}, bound to {obj!r}")
        return problems


def plugin_files() -> list[Path]:
    """The files named in $VERL_NPU_PLUGINS (separated by the OS path separator): their declarations join
    every registry's built-in ones, as if they were files of the package (read in every process of a run,
    which inherits the variable)."""
    value = os.environ.get(PLUGINS_VARIABLE, "")
    files = [Path(p).expanduser().resolve() for p in value.split(os.pathsep) if p.strip()]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise RegistryError(f"${PLUGINS_VARIABLE} names files that do not exist: {', '.join(missing)}")
    return files


def load_file(path: str | os.PathLike) -> Any:
    """Imports a user's .py file by path, once per process (a module named after its absolute path)."""
    resolved = Path(path).expanduser().resolve()
    module_name = "verl_npu_user_" + "".join(c if c.isalnum() else "_" for c in str(resolved))
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise RegistryError(f"cannot import {resolved}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
