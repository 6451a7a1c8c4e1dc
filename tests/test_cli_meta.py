"""Every command has help with an example and appears in the README; the README's commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import click

from harness.cli import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


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


def test_every_command_has_help_with_an_example(cli) -> None:
    assert len(COMMANDS) >= 15
    for full, cmd in COMMANDS:
        res = cli(*full.split()[1:], "--help")
        assert res.exit_code == 0, full
        assert cmd.help and cmd.help.strip().splitlines()[0], f"{full} has no one-line summary"
        assert "Example:" in cmd.help, f"{full} has no example in its help"


def test_every_command_is_in_the_readme() -> None:
    missing = [full for full, _ in COMMANDS if full not in README]
    assert not missing, f"commands missing from README.md: {missing}"


def test_readme_sbench_lines_name_real_commands() -> None:
    names = {full for full, _ in COMMANDS}
    code = "\n".join(re.findall(r"```(?:bash)?\n(.*?)```", README, re.S))
    found = re.findall(r"(?:^|[\s;(])(sbench [a-z][\w-]*(?: [a-z][\w-]*)?)", code, re.M)
    assert len(found) >= 15
    for line in found:
        words = line.split()
        assert " ".join(words[:2]) in names or " ".join(words[:3]) in names, line


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
