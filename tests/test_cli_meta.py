"""Every command has help with an example and is described in the docs; the docs' commands, options and
``SBENCH_*`` variables exist.

The docs are README.md and every page of docs/: each check holds over the whole set. "Described" means in a page
written by hand: docs/cli.md, generated from the command tree, names every command by construction, so it counts
for the checks that the docs name real things, not for the check that every command is described.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from harness.cli import main
from harness.contract import envvars

ROOT = Path(__file__).resolve().parent.parent
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
GENERATED = {"docs/cli.md"}
DOCS = "\n".join(PAGES.values())
WRITTEN = "\n".join(text for name, text in PAGES.items() if name not in GENERATED)


def _commands(group: click.Group, prefix: str = "sbench") -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix} {name}"
        if isinstance(cmd, click.Group):
            out += _commands(cmd, full)
        else:
            out.append((full, cmd))
    return out


COMMANDS = _commands(main)
BY_NAME = dict(COMMANDS)


def _code(text: str) -> str:
    """The lines of a page's shell code blocks (fenced as ``bash`` or unlabelled; not yaml, json, text...)."""
    out: list[str] = []
    fence: str | None = None  # the open block's language, None outside a block
    for line in text.splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence in ("", "bash"):
            out.append(line)
    return "\n".join(out)


def _sbench_lines() -> list[tuple[str, str]]:
    """Each ``sbench ...`` command line of a code block of the docs, with its page: a line's comment dropped, and
    a line holding several commands (``a ; b``, ``a | b``) cut into them."""
    out = []
    for page, text in PAGES.items():
        for line in _code(text).splitlines():
            line = re.sub(r"\s#.*$", "", line)
            for part in re.split(r"\s(?:;|\||&&)\s", line):
                m = re.search(r"(?:^|[\s(])(sbench [a-z].*)$", part)
                if m:
                    out.append((page, m.group(1).strip()))
    return out


def test_every_command_has_help_with_an_example(cli) -> None:
    assert len(COMMANDS) >= 15
    for full, cmd in COMMANDS:
        res = cli(*full.split()[1:], "--help")
        assert res.exit_code == 0, full
        assert cmd.help and cmd.help.strip().splitlines()[0], f"{full} has no one-line summary"
        assert "Example:" in cmd.help, f"{full} has no example in its help"


def test_every_command_is_described_in_the_docs() -> None:
    missing = [full for full, _ in COMMANDS if full not in WRITTEN]
    assert not missing, f"commands no page of README.md or docs/ (but the generated cli.md) describes: {missing}"


def test_the_docs_sbench_lines_name_real_commands() -> None:
    names = {full for full, _ in COMMANDS}
    code = "\n".join(re.sub(r"\s#.*$", "", line) for text in PAGES.values() for line in _code(text).splitlines())
    found = re.findall(r"(?:^|[\s;(])(sbench [a-z][\w-]*(?: [a-z][\w-]*)?)", code, re.M)
    assert len(found) >= 15
    for line in found:
        words = line.split()
        assert " ".join(words[:2]) in names or " ".join(words[:3]) in names, line


def test_the_docs_sbench_lines_use_real_options() -> None:
    # Every --option of an sbench command line in a code block is an option of that very command.
    checked, wrong = 0, []
    for page, line in _sbench_lines():
        try:
            words = shlex.split(line)
        except ValueError:  # an unbalanced quote (a query cut short by "..."): its words as written
            words = line.split()
        name = " ".join(words[:3]) if " ".join(words[:3]) in BY_NAME else " ".join(words[:2])
        cmd = BY_NAME.get(name)
        if cmd is None:
            continue
        known = {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
        known |= {"--help", "-h"}
        for word in words[len(name.split()):]:
            if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", word):
                checked += 1
                if word.split("=")[0] not in known:
                    wrong.append(f"{page}: {line}: {word.split('=')[0]} is no option of {name}")
    assert checked >= 20
    assert not wrong, "\n".join(wrong)


def test_the_docs_name_only_variables_something_reads() -> None:
    # Each SBENCH_* the docs name is sbench's (harness/contract/envvars.py), or read by the tests or the
    # benchmarks themselves; _SBENCH_COMPLETE is Click's completion switch.
    listed = {v.name for v in envvars.VARS}
    outside = "\n".join(p.read_text(errors="replace") for d in ("tests", "bench") for p in (ROOT / d).rglob("*")
                        if p.is_file() and p.suffix in (".py", ".sh"))
    named = set(re.findall(r"(?<![\w])SBENCH_[A-Z0-9_]+", DOCS))
    unknown = sorted(n for n in named if n not in listed and n not in outside)
    assert not unknown, f"the docs name variables nothing reads: {unknown}"
    assert "_SBENCH_COMPLETE" in DOCS  # shell completion is documented


def test_every_command_is_loaded_by_name_and_only_its_module_at_start() -> None:
    # The group loads a command's module when the command runs: the table must name every command, and a
    # command must start without the modules of the others (status needs no Jinja2, render no DuckDB).
    import subprocess
    import sys

    from harness.cli.base import COMMANDS

    assert set(main.commands) == set(COMMANDS)
    code = ("import sys\nfrom harness.cli import main\nmain.get_command(None, 'render')\n"
            "print(sorted(m for m in ('harness.cli.jobs', 'harness.cli.results', 'duckdb', 'submitit') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
