# SPDX-License-Identifier: Apache-2.0
"""The README and ``docs/*.md`` name only what exists.

Every repository path they name (``models/...``, ``scripts/...``, ``tests/...``, ``docs/...``,
``.github/...``, a requirements file) resolves; every link between pages resolves; every dotted
``models.`` name is a module, or a name a module defines; every ``python -m X`` module is found by
:func:`importlib.util.find_spec`; every ``tt-cache`` command in code is a subcommand of the CLI's own
parser, with options that subcommand takes; the README shows the suites ``.ci/run`` runs, as it runs
them; and ``docs/layout.md`` names every module under ``models/`` and no other. A module renamed or moved fails here, naming the page, the line and the name."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from models.testing import REPO_ROOT
from models.tt_cache.cli import build_parser

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LAYOUT = REPO_ROOT / "docs" / "layout.md"

# A repository path: starts at one of the repository's top-level entries, not inside another path.
REPO_PATH = re.compile(r"(?<![\w./$~-])((?:models|scripts|tests|docs|\.github|\.ci)/[\w./*<>-]*"
                       r"|requirements[\w-]*\.txt|setup\.py|pytest\.ini|conftest\.py)")
PATH_AND_NAME = re.compile(r"`((?:models|scripts)/[\w/]+\.py): (\w+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOTTED = re.compile(r"(?<![\w./-])(models(?:\.\w+)+)")
PYTHON_M = re.compile(r"python[\d.]*\s+-m\s+([\w.]+)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
TT_CACHE = re.compile(r"(?<![\w-])tt-cache\s+([a-z]+)((?:\s+[^\s|;#&`)]+)*)")


def lines_of(page: Path) -> Iterator[tuple[int, str]]:
    yield from enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)


def code_of(page: Path) -> Iterator[tuple[int, str]]:
    """Each line of a fenced block, and each inline code span outside one."""
    fenced = False
    for number, line in lines_of(page):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in CODE_SPAN.findall(line):
                yield number, span


def where(page: Path, number: int) -> str:
    return f"{page.relative_to(REPO_ROOT)}:{number}"


def resolves(base: Path, name: str) -> bool:
    if "*" in name:
        return any(base.glob(name))
    return (base / name).exists()


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    for page in PAGES:
        for number, line in lines_of(page):
            for name in REPO_PATH.findall(line):
                name = name.rstrip(".,:;")
                if "<" in name:  # a pattern such as tests/ttnn/<area>/, not a path
                    continue
                if not resolves(REPO_ROOT, name):
                    missing.append(f"{where(page, number)}: {name}")
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)


def test_every_link_between_pages_resolves() -> None:
    missing = []
    for page in PAGES:
        for number, line in lines_of(page):
            for target in LINK.findall(line):
                path = target.split("#", 1)[0]
                if not path or re.match(r"[a-z]+:", path):  # an anchor on the page, or a URL
                    continue
                if not resolves(page.parent, path):
                    missing.append(f"{where(page, number)}: {target}")
    assert not missing, "links to nothing:\n" + "\n".join(missing)


@cache
def defined_names(source: Path) -> frozenset[str]:
    """The names a module's top level binds: definitions, assignments and imports."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


def module_source(dotted: str) -> Path | None:
    """The source file of module ``dotted``, or None when it is no module."""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):  # a parent is a module, not a package
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def dotted_problem(dotted: str) -> str | None:
    """Why ``models.a.b.Name`` names nothing: its longest module prefix must define what follows it
    (a name, or a class and its attribute)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        source = module_source(".".join(parts[:end]))
        if source is None:
            continue
        rest = parts[end:]
        if not rest:
            return None
        if len(rest) > 2:
            return f"{'.'.join(parts[:end])} has no module {rest[0]}"
        if rest[0] not in defined_names(source):
            return f"{'.'.join(parts[:end])} defines no {rest[0]}"
        return None
    return "no such module"


def test_every_dotted_module_name_the_docs_name_exists() -> None:
    missing = []
    for page in PAGES:
        for number, span in code_of(page):
            for dotted in DOTTED.findall(span):
                problem = dotted_problem(dotted.rstrip("."))
                if problem:
                    missing.append(f"{where(page, number)}: {dotted}: {problem}")
    assert not missing, "the docs name modules or names that do not exist:\n" + "\n".join(missing)


def test_a_path_and_the_name_beside_it_exist() -> None:
    """``models/common/heads.py: column_heads``: the file, and the name in it."""
    missing = []
    for page in PAGES:
        for number, line in lines_of(page):
            for path, name in PATH_AND_NAME.findall(line):
                source = REPO_ROOT / path
                if source.exists() and name not in defined_names(source):
                    missing.append(f"{where(page, number)}: {path} defines no {name}")
    assert not missing, "\n".join(missing)


def test_every_python_m_module_is_found() -> None:
    missing = []
    for page in PAGES:
        for number, line in lines_of(page):
            for module in PYTHON_M.findall(line):
                if module_source(module.rstrip(".")) is None:
                    missing.append(f"{where(page, number)}: python -m {module}")
    assert not missing, "python -m of modules that do not exist:\n" + "\n".join(missing)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((action.choices for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction)), {})


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


@cache
def cli_commands() -> dict[str, argparse.ArgumentParser]:
    return subcommands(build_parser())


def tt_cache_problem(command: str, rest: str) -> str | None:
    """Why ``tt-cache COMMAND REST`` is no command of the CLI: an unknown subcommand, or an option it
    does not take. ``prefill ls|verify|gc`` names three subcommands at once."""
    commands = cli_commands()
    if command not in commands:
        return f"no subcommand {command!r} (the CLI has {', '.join(commands)})"
    parser, words = commands[command], rest.split()
    nested = subcommands(parser)
    if nested:
        if not words or words[0].startswith("-"):
            return None  # the group itself, as in "tt-cache prefill --help"
        names = words.pop(0).split("|")
        unknown = [name for name in names if name not in nested]
        if unknown:
            return f"{command} has no subcommand {unknown[0]!r} (it has {', '.join(nested)})"
        parsers = [nested[name] for name in names]
    else:
        parsers = [parser]
    for word in words:
        option = word.split("=", 1)[0].rstrip(",.:")
        if re.fullmatch(r"--[a-z][\w-]*", option) and not all(option in options(p) for p in parsers):
            return f"{command} takes no option {option}"
    return None


def test_every_tt_cache_command_the_docs_show_is_in_the_cli() -> None:
    missing = []
    for page in PAGES:
        for number, code in code_of(page):
            code = re.sub(r"(^|\s)#.*", "", code)  # a shell comment is prose
            for command, rest in TT_CACHE.findall(code):
                problem = tt_cache_problem(command, rest)
                if problem:
                    missing.append(f"{where(page, number)}: tt-cache {command}{rest}: {problem}")
    assert not missing, "tt-cache commands the CLI does not have:\n" + "\n".join(missing)


def test_the_readme_shows_the_suites_ci_runs() -> None:
    """``.ci/run`` runs the README's test commands: each suite script it runs, with the ``-m``
    expression it selects tests by, is in the README's commands as written."""
    readme = "\n".join(code for _, code in code_of(REPO_ROOT / "README.md"))
    suites = re.findall(r"(scripts/run_\w*tests\.sh)([^\n]*)", (REPO_ROOT / ".ci" / "run").read_text())
    assert suites, ".ci/run runs no suite script"
    for script, arguments in suites:
        assert script in readme, f"the README does not show {script}"
        for expression in re.findall(r'-m\s+("[^"]+")', arguments):
            assert f"{script} " in readme and expression in readme, f"the README does not show {script} -m {expression}"


def layout_modules(text: str) -> dict[Path, str]:
    """The modules docs/layout.md names, each with its line: a heading names package directories
    (``## `models/common/weight_cache/` ``), and each list item below it modules relative to one of
    them or to ``models/`` (``- `warm_read.py`: ...``, ``- `llama/loader.py`: ...``)."""
    named: dict[Path, str] = {}
    bases = [REPO_ROOT / "models"]
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            bases = [REPO_ROOT / d for d in re.findall(r"`(models/[\w/]*)`", line)] + [REPO_ROOT / "models"]
        elif line.startswith("- "):
            for name in re.findall(r"`([\w/]+\.py)`", line.split(": ", 1)[0]):
                found = [base / name for base in bases if (base / name).exists()]
                named[found[0] if found else bases[0] / name] = f"docs/layout.md:{number}"
    return named


def test_the_layout_page_names_every_module_and_only_modules() -> None:
    named = layout_modules(LAYOUT.read_text(encoding="utf-8"))
    modules = {m for m in (REPO_ROOT / "models").rglob("*.py") if m.name != "__init__.py"}
    unnamed = sorted(str(m.relative_to(REPO_ROOT)) for m in modules - set(named))
    gone = sorted(f"{line}: {m.relative_to(REPO_ROOT)}" for m, line in named.items() if m not in modules)
    assert not unnamed, "docs/layout.md does not name:\n" + "\n".join(unnamed)
    assert not gone, "docs/layout.md names modules that do not exist:\n" + "\n".join(gone)


@pytest.mark.parametrize("name, expected", [
    ("models/common/weight_cache/warm_read.py", True),
    ("models/common/weight_cache/no_such_module.py", False),
])
def test_the_path_check_tells_a_path_from_none(name: str, expected: bool) -> None:
    assert resolves(REPO_ROOT, name) is expected


@pytest.mark.parametrize("dotted, problem", [
    ("models.common.weight_cache.warm_read.WarmRead", None),
    ("models.common.weight_cache.warm_read.ColdRead", "models.common.weight_cache.warm_read defines no ColdRead"),
    ("models.common.no_such_module", "models.common defines no no_such_module"),
])
def test_the_dotted_check_tells_a_name_from_none(dotted: str, problem: str | None) -> None:
    assert dotted_problem(dotted) == problem


@pytest.mark.parametrize("command, rest, problem", [
    ("gc", " --max-size 500G --dry-run", None),
    ("prefill", " ls|verify|gc ROOT", None),
    ("gc", " --biggest-first", "gc takes no option --biggest-first"),
    ("prefill", " ls|purge ROOT", "prefill has no subcommand 'purge' (it has ls, verify, gc)"),
])
def test_the_tt_cache_check_tells_a_command_from_none(command: str, rest: str, problem: str | None) -> None:
    assert tt_cache_problem(command, rest) == problem


def test_an_unknown_subcommand_is_named() -> None:
    assert tt_cache_problem("scrub", " DIR").startswith("no subcommand 'scrub'")
