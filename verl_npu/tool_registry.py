"""Tools by name, and verl's tool config file read without importing any tool (the bottom layer).

A tool config file is verl's YAML (`actor_rollout_ref.rollout.multi_turn.tool_config_path`)::

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool     # or gsm8k, or my_tools.py:MyTool, or pkg.mod.MyTool
        config: {type: native}                          # handed to the tool's constructor as `config`
        tool_schema:                                    # an OpenAI function schema
          type: function
          function:
            name: calc_gsm8k_reward
            description: ...
            parameters: {type: object, properties: {answer: {type: string, description: ...}}, required: [answer]}

`class_name` is one of:
- a built-in tool's name (`BUILTIN_TOOLS`: `gsm8k`, `geo3k`, `image_zoom_in`, `code_interpreter`,
  `retool_code_interpreter`, `search`; each declared on its class with `@TOOLS.register` and read from the
  `verl_npu.registry.TOOLS` registry), or verl's class path of that tool (`VERL_CLASS_PATHS`: a config written
  for verl works unchanged);
- `path/to/file.py:ClassName`: a class in the user's own Python file (relative paths start at the
  folder the run starts in);
- `package.module.ClassName`: a class in an importable module (verl's own spelling).

`read_tool_config(path)` checks the file's shape and returns its entries, or the problems, each naming the
file and the entry's key (`tools[0].tool_schema.function.name`); nothing is imported. Loading the
classes, building the tools and checking each schema against its class is `verl_npu.tools.loading`.
This module imports only the standard library, PyYAML and the registries, so the config layer can use it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_npu.registry import TOOLS

#: built-in tools, declared with `@TOOLS.register` on their classes (verl_npu/tools/), read without importing
#: them: name -> "module:Class" (imported only when a run builds its tools).
BUILTIN_TOOLS: dict[str, str] = {name: spec.target for name, spec in TOOLS.specs.items()}
#: built-in tools: name -> the function name its schema must have (checked without importing it); None:
#: any name (the code interpreter: verl's Sandbox Fusion tool takes its name from the schema).
BUILTIN_FUNCTION_NAMES: dict[str, str | None] = {name: spec.function_name for name, spec in TOOLS.specs.items()}
#: built-in tools whose replies hold images (they need a vision-language model on the hf engine)
IMAGE_TOOLS: set[str] = {name for name, spec in TOOLS.specs.items() if spec.returns_images}
#: verl's class paths of tools verl-npu ships: a verl tool config names them, verl-npu builds its own.
VERL_CLASS_PATHS: dict[str, str] = {path: name for name, spec in TOOLS.specs.items() for path in spec.verl_class_paths}
#: verl's own tools that verl-npu does not build: class path -> (what it needs, what to do instead)
UNBUILT_VERL_TOOLS: dict[str, tuple[str, str]] = {
    "verl.tools.mcp_search_tool.MCPSearchTool": (
        "is an MCP tool",
        "write a native tool class (docs/agents.md, 'Writing a tool')",
    )
}
#: verl's tool `config.type` values, and those built here.
TOOL_TYPES = ("native",)
UNSUPPORTED_TOOL_TYPES = {"mcp": "MCP tools are not built; write a native tool class (docs/agents.md)"}


#: the search tool's `config:` keys (verl's SearchTool's, then verl-npu's own) -> (type check, what it must be)
SEARCH_CONFIG_KEYS: dict[str, tuple[Any, str]] = {
    "type": (lambda v: True, "native"),  # checked with every tool's type below
    "retrieval_service_url": (
        lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
        "the retrieval server's URL, http://host:port/retrieve",
    ),
    "topk": (lambda v: _positive_int(v), "a positive integer (documents per query)"),
    "timeout": (lambda v: _positive_number(v), "a positive number of seconds"),
    "num_workers": (lambda v: _positive_int(v), "a positive integer (requests of this tool in flight at once)"),
    "rate_limit": (lambda v: _positive_int(v), "a positive integer (requests in flight at once, all search tools)"),
    "enable_global_rate_limit": (lambda v: isinstance(v, bool), "true or false"),
    # verl-npu's own: verl's retry loop as settings (verl: 10 tries, 1 s more delay before each retry)
    "max_attempts": (lambda v: _positive_int(v), "a positive integer (tries of one request)"),
    "retry_delay": (lambda v: _positive_number(v) or v == 0, "a number of seconds >= 0"),
    "call_timeout": (
        lambda v: v is None or isinstance(v, (int, float)) and not isinstance(v, bool),
        "a number of seconds (0: no limit)",
    ),
}


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _positive_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def search_config_problems(config: dict, key: str) -> list[tuple[str, str]]:
    """(key, problem) of a search tool's `config:`: a missing retrieval_service_url, a bad value, an
    unknown key (refused by name: nothing is silently ignored)."""
    out = []
    if not config.get("retrieval_service_url"):
        out.append(
            (
                f"{key}.retrieval_service_url",
                "is missing: the search tool queries a retrieval server "
                "(e.g. http://127.0.0.1:8000/retrieve; start one with `verl-npu retrieval-server --corpus "
                "corpus.jsonl`)",
            )
        )
    for name, value in config.items():
        if name not in SEARCH_CONFIG_KEYS:
            out.append(
                (f"{key}.{name}", f"is not a key of the search tool (keys: {', '.join(SEARCH_CONFIG_KEYS)}); remove it")
            )
        elif value is not None:
            ok, want = SEARCH_CONFIG_KEYS[name]
            if not ok(value):
                out.append((f"{key}.{name}", f"is {value!r}; it must be {want}"))
    return out


@dataclass
class ToolEntry:
    """One `tools:` entry of a tool config file, checked for shape."""

    index: int
    class_name: str
    config: dict = field(default_factory=dict)
    schema: dict | None = None  # {"type": "function", "function": {...}} or None (the class gives it)
    where: str = ""  # "<file> tools[i]"

    @property
    def name(self) -> str | None:
        return (self.schema or {}).get("function", {}).get("name")

    @property
    def queries_retrieval_server(self) -> bool:
        """A built-in tool that queries a retrieval server (config.retrieval_service_url: the search tool)."""
        return self.builtin is not None and TOOLS.spec(self.builtin).retrieval_server

    @property
    def demo_data(self) -> str:
        """ "module:function" of the synthetic demo data of a built-in tool's task ('' when none)."""
        return TOOLS.spec(self.builtin).demo_data if self.builtin is not None else ""

    @property
    def builtin(self) -> str | None:
        """The built-in tool this entry names, else None."""
        if self.class_name in BUILTIN_TOOLS:
            return self.class_name
        return VERL_CLASS_PATHS.get(self.class_name)


def class_target(
    class_name: str, builtins: dict[str, str] = BUILTIN_TOOLS, verl_paths: dict[str, str] = VERL_CLASS_PATHS
) -> tuple[str, str, str]:
    """(kind, where, class) of a `class_name` in a tool or interaction config: kind 'builtin' (a name of
    `builtins`, or a verl class path `verl_paths` maps to one; where: its module), 'file'
    (path/to/file.py:Class) or 'module' (package.module.Class)."""
    if class_name in builtins or class_name in verl_paths:
        module, _, cls = builtins[verl_paths.get(class_name, class_name)].partition(":")
        return "builtin", module, cls
    if ":" in class_name:
        path, _, cls = class_name.rpartition(":")
        return "file", path, cls
    module, _, cls = class_name.rpartition(".")
    return "module", module, cls


def _schema_problems(schema: Any, key: str) -> list[tuple[str, str]]:
    """(key, problem) for a tool schema that is not an OpenAI function schema."""
    if not isinstance(schema, dict):
        return [(key, "must be a mapping {type: function, function: {name, description, parameters}}")]
    out = []
    if schema.get("type") != "function":
        out.append((f"{key}.type", f"is {schema.get('type')!r}; OpenAI tool schemas have type: function"))
    fn = schema.get("function")
    if not isinstance(fn, dict):
        return out + [(f"{key}.function", "must be a mapping with name, description and parameters")]
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        out.append((f"{key}.function.name", "must be the tool's name (a non-empty string)"))
    if not isinstance(fn.get("description", ""), str):
        out.append((f"{key}.function.description", "must be a string"))
    params = fn.get("parameters")
    if params is not None:
        if not isinstance(params, dict) or params.get("type") != "object":
            out.append((f"{key}.function.parameters", "must be a JSON schema of type: object"))
        else:
            props = params.get("properties") or {}
            if not isinstance(props, dict) or not all(isinstance(p, dict) and "type" in p for p in props.values()):
                out.append(
                    (
                        f"{key}.function.parameters.properties",
                        "must map each parameter name to a schema with a type (e.g. {type: string})",
                    )
                )
            required = params.get("required") or []
            missing = [r for r in required if r not in props] if isinstance(required, list) else required
            if not isinstance(required, list) or missing:
                out.append(
                    (f"{key}.function.parameters.required", f"names parameters that are not in properties: {missing}")
                )
    return out


def class_name_problems(
    class_name: Any,
    key: str,
    *,
    what: str,
    builtins: dict[str, str],
    verl_paths: dict[str, str],
    verl_hint: str,
    unbuilt: dict[str, tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """(key, problem) for the class_name of a tool or interaction entry (`what`: "tool" / "interaction"),
    found without importing anything: a built-in, an existing path/to/file.py:Class (relative to the
    current folder), or package.module.Class on the Python path. A class of verl is refused with
    `verl_hint` (how to port it); `unbuilt` verl classes with (what they need, what to do instead)."""
    if not isinstance(class_name, str) or not class_name.strip():
        return [
            (
                key,
                f"must name the {what} class: a built-in ({', '.join(builtins)}), path/to/file.py:ClassName "
                "or package.module.ClassName",
            )
        ]
    kind, where, cls = class_target(class_name, builtins, verl_paths)
    if kind == "builtin":
        return []
    if not cls.isidentifier():
        return [(key, f"{class_name!r} does not end in a class name")]
    if kind == "file":
        path = Path(os.path.expanduser(where))
        path = path if path.is_absolute() else Path.cwd() / path
        return [] if path.is_file() else [(key, f"{class_name!r}: file {str(path)!r} does not exist")]
    if not where:
        return [
            (
                key,
                f"{class_name!r} is neither a built-in {what} ({', '.join(builtins)}) nor "
                "package.module.ClassName nor path/to/file.py:ClassName",
            )
        ]
    if class_name in (unbuilt or {}):
        needs, instead = unbuilt[class_name]
        return [(key, f"verl-npu does not support verl's {cls} yet (it {needs}); {instead}")]
    if where.startswith("verl."):
        return [(key, f"{class_name!r} is a class of verl, which verl-npu does not import: {verl_hint}")]
    try:
        found = importlib.util.find_spec(where) is not None
    except (ImportError, ValueError):
        found = False
    return [] if found else [(key, f"{class_name!r}: module {where!r} cannot be found on the Python path")]


def listed_mappings(
    path: str | os.PathLike, section: str, fields: tuple[str, ...], what: str, *, non_empty: bool = False
) -> tuple[Path, list[tuple[int, str, dict]], list[tuple[str, str]]]:
    """The entries listed under `section` of the YAML file `path` (a tool or interaction config):
    (the file's path, [(index, key, mapping)], problems). A problem is (where, what is wrong); `key`
    names the file and the entry (`<path>: section[i]`). An entry that is not a mapping is left out
    with its problem; one with fields other than `fields` is kept, its unknown fields named."""
    import yaml

    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        return path, [], [(str(path), f"the {what} config file does not exist")]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        return path, [], [(str(path), f"is not valid YAML: {str(err).splitlines()[0]}")]
    items = data.get(section) if isinstance(data, dict) else None
    shape = f"{section}: [{{{', '.join(fields)}}}]"
    if not isinstance(items, list) or (non_empty and not items):
        kind = "a non-empty list" if non_empty else "a list"
        return path, [], [(f"{path}: {section}", f"must be {kind} of {what}s ({shape})")]
    entries, problems = [], []
    for i, item in enumerate(items):
        key = f"{path}: {section}[{i}]"
        if not isinstance(item, dict):
            problems.append((key, f"must be a mapping with {', '.join(fields[:-1])} and {fields[-1]}"))
            continue
        unknown = sorted(set(item) - set(fields))
        if unknown:
            article = "an" if what[:1] in "aeiou" else "a"
            problems.append((key, f"has unknown field(s) {unknown}; {article} {what} has {', '.join(fields)}"))
        entries.append((i, key, item))
    return path, entries, problems


def read_tool_config(path: str | os.PathLike) -> tuple[list[ToolEntry], list[tuple[str, str]]]:
    """(entries, problems) of a tool config file; a problem is (where, what is wrong), `where` naming
    the file and the entry's key. Nothing is imported (module classes are only looked up)."""
    path, items, problems = listed_mappings(path, "tools", ("class_name", "config", "tool_schema"), "tool")
    entries, names = [], {}
    for i, key, item in items:
        problems += class_name_problems(
            item.get("class_name"),
            f"{key}.class_name",
            what="tool",
            builtins=BUILTIN_TOOLS,
            verl_paths=VERL_CLASS_PATHS,
            unbuilt=UNBUILT_VERL_TOOLS,
            verl_hint=f"the built-in tools are {', '.join(sorted(VERL_CLASS_PATHS))}; for your own tool change its "
            "import to `from verl_npu.tools import BaseTool, ToolResponse` and name it path/to/file.py:ClassName",
        )
        config = item.get("config") or {}
        if not isinstance(config, dict):
            problems.append((f"{key}.config", "must be a mapping (e.g. {type: native})"))
            config = {}
        kind = config.get("type", "native")
        named = item.get("class_name")
        entry_builtin = (
            (named if named in BUILTIN_TOOLS else VERL_CLASS_PATHS.get(named)) if isinstance(named, str) else None
        )
        if entry_builtin is not None:  # a built-in that checks its `config:` here (the search tool)
            problems += TOOLS.spec(entry_builtin).config_problems(config, f"{key}.config")
        if kind in UNSUPPORTED_TOOL_TYPES:
            problems.append((f"{key}.config.type", f"is {kind!r}: {UNSUPPORTED_TOOL_TYPES[kind]}"))
        elif kind not in TOOL_TYPES:
            problems.append((f"{key}.config.type", f"is {kind!r}; tool types: {', '.join(TOOL_TYPES)}"))
        schema = item.get("tool_schema")
        if schema is not None:
            problems += _schema_problems(schema, f"{key}.tool_schema")
        entry = ToolEntry(i, str(item.get("class_name")), dict(config), schema, key)
        builtin_name = BUILTIN_FUNCTION_NAMES.get(entry.builtin or "")
        if builtin_name and entry.name and entry.name != builtin_name:
            problems.append(
                (
                    f"{key}.tool_schema.function.name",
                    f"is {entry.name!r} but {entry.class_name!r} is the "
                    f"tool {builtin_name!r}; use name: {builtin_name}",
                )
            )
        if entry.name in names:
            problems.append(
                (
                    f"{key}.tool_schema.function.name",
                    f"{entry.name!r} is also the name of tools[{names[entry.name]}]; tool names must be unique",
                )
            )
        elif entry.name:
            names[entry.name] = i
        entries.append(entry)
    return entries, problems
