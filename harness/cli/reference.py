"""The command-line reference, ``docs/cli.md``, written from the command tree itself.

:func:`render_reference` walks :data:`harness.cli.base.main` with click's own API: every command and
subcommand with its usage line, its help text, its arguments, and every option with its help, default,
range and environment variable; then every ``SBENCH_*`` variable of :mod:`harness.contract.envvars`. A
command's module is loaded the way the group loads it when the command runs (``get_command``, through
:data:`~harness.cli.base.COMMANDS`), so the reference imports what ``sbench CMD --help`` imports and no more.

``python -m harness.cli.reference > docs/cli.md`` (``make docs``) writes it; tests/test_docs.py fails when the
committed page and the tree disagree.
"""

from __future__ import annotations

import inspect
from typing import Any

import click

from harness.cli.base import COMMANDS, main
from harness.contract import envvars

HEADER = """\
# The sbench command line

Every command and subcommand of `sbench`, with its usage, its help, and each option with its help and default.
This page is generated from the command tree (`harness/cli/reference.py`): run `make docs` after changing a
command, and never edit it by hand (`tests/test_docs.py` compares the two). The guides that say when to use each
command are listed in the [README](../README.md#the-docs).

Exit codes: 0 success; 2 bad input (the message names the file, the key and the fix); 1 a runtime error (`check`
and `compare`: a failed check or a regression); 130 / 143 stopped by SIGINT / SIGTERM; 141 the reader of its
output went away. Every command takes `-h` / `--help`; every command that reads prints a table, and JSON with
`--json`.

Shell completion is Click's own:

```bash
eval "$(_SBENCH_COMPLETE=bash_source sbench)"   # bash: add to ~/.bashrc
eval "$(_SBENCH_COMPLETE=zsh_source sbench)"    # zsh: add to ~/.zshrc
_SBENCH_COMPLETE=fish_source sbench | source    # fish
```
"""


def _unset(value: Any) -> bool:
    """click's "no default" (``None``, or its ``UNSET`` sentinel in recent releases)."""
    return value is None or repr(value).endswith("UNSET")


def _md(text: str) -> str:
    """Help text as Markdown that shows it as written: the characters Markdown would read as markup escaped."""
    for ch in ("\\", "`", "*", "_", "<", ">", "|", "[", "]"):
        text = text.replace(ch, "\\" + ch)
    return text


def _help_text(cmd: click.Command) -> str:
    """The command's help as ``--help`` shows it: dedented, cut at ``\\f``, its ``\\b`` markers dropped."""
    text = inspect.cleandoc(cmd.help or "").split("\f")[0]
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b").strip()


def _range(info: dict[str, Any]) -> str:
    """A numeric range type's bounds in words (``1 or more``, ``0 to 1, 1 excluded``), else ``""``."""
    lo, hi = info.get("min"), info.get("max")
    if lo is None and hi is None:
        return ""
    lo_s = f"{lo} (excluded)" if info.get("min_open") else f"{lo}"
    hi_s = f"{hi} (excluded)" if info.get("max_open") else f"{hi}"
    if hi is None:
        return f"at least {lo_s}" if not info.get("min_open") else f"above {lo}"
    if lo is None:
        return f"at most {hi_s}" if not info.get("max_open") else f"below {hi}"
    return f"{lo_s} to {hi_s}"


def _default(param: click.Parameter, info: dict[str, Any]) -> str:
    """The default as a reader needs it: a flag's on or off, a value, or ``none`` (the help then says what)."""
    value = info.get("default")
    if info.get("is_flag") and not info.get("secondary_opts") and not info.get("count"):
        return "on" if value is True else "off"
    if info.get("count"):
        return str(value if isinstance(value, int) else 0)
    if _unset(value) or value == () or value == []:
        return "none"
    if isinstance(value, bool) and info.get("secondary_opts"):
        return info["opts"][0] if value else info["secondary_opts"][0]
    if isinstance(value, (list, tuple)):
        return ", ".join(f"`{v}`" for v in value)
    return f"`{value}`"


def _option(param: click.Option, ctx: click.Context) -> str:
    record = param.get_help_record(ctx)
    names = record[0] if record else ", ".join(param.opts)
    info = param.to_info_dict()
    facts = [_md(param.help.strip())] if param.help else []
    default = _default(param, info)
    if not (default == "none" and param.help and "default" in param.help.lower()):  # the help says it better
        facts.append(f"Default: {default}.")
    bounds = _range(info.get("type", {}))
    if bounds:
        facts.append(f"Range: {bounds}.")
    if param.required:
        facts.append("Required.")
    if param.multiple:
        facts.append("Repeatable.")
    if param.envvar:
        names_env = param.envvar if isinstance(param.envvar, (list, tuple)) else [param.envvar]
        facts.append("Environment: " + ", ".join(f"`{e}`" for e in names_env) + ".")
    return f"- `{names}`: " + " ".join(facts)


def _argument(param: click.Argument, ctx: click.Context) -> str:
    metavar = " ".join(param.get_usage_pieces(ctx))
    facts = ["required" if param.required else "optional"]
    if param.nargs == -1:
        facts.append("any number")
    kind = param.type.name
    if kind and kind != "text":
        facts.append(kind)
    return f"- `{metavar}`: " + ", ".join(facts) + "."


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[click.Command, click.Context]]:
    """Every command under *group*, depth first in the order ``--help`` lists them, each with its context."""
    out: list[tuple[click.Command, click.Context]] = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)  # loads the command's module, as running it would
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        out.append((cmd, sub))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, sub)
    return out


def _anchor(path: str) -> str:
    return path.replace(" ", "-")


def _section(cmd: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    lines = [f"## {path}", "", "```text", f"Usage: {path} {' '.join(cmd.collect_usage_pieces(ctx))}".rstrip(),
             "```", ""]
    for para in _help_text(cmd).split("\n\n"):
        prose = [line for line in para.splitlines() if not line.startswith("Example: ")]
        if prose:
            lines += [_md("\n".join(prose)), ""]
        lines += [f"Example: `{line.removeprefix('Example: ')}`\n" for line in para.splitlines()
                  if line.startswith("Example: ")]
    help_names = set(ctx.help_option_names)
    params = [p for p in cmd.get_params(ctx)
              if not getattr(p, "hidden", False) and not (isinstance(p, click.Option) and help_names & set(p.opts))]
    arguments = [p for p in params if isinstance(p, click.Argument)]
    options = [p for p in params if isinstance(p, click.Option)]
    if arguments:
        lines += ["Arguments:", ""] + [_argument(p, ctx) for p in arguments] + [""]
    if options:
        lines += ["Options:", ""] + [_option(p, ctx) for p in options] + [""]
    if isinstance(cmd, click.Group) and ctx.parent is not None:  # the root's list is the index above
        subs = [(n, cmd.get_command(ctx, n)) for n in cmd.list_commands(ctx)]
        lines += ["Subcommands:", ""]
        lines += [f"- [`{path} {n}`](#{_anchor(f'{path} {n}')}): {_md(c.get_short_help_str(200))}"
                  for n, c in subs if c is not None and not c.hidden] + [""]
    return lines


def _envvars() -> list[str]:
    kinds = {"login": "the login-node commands read it", "job": "set for a job's processes, read by the runner",
             "tests": "a switch for the tests"}
    lines = ["## Environment variables", "",
             "Every `SBENCH_*` variable sbench reads or sets, from `harness/contract/envvars.py`; an empty value "
             "counts as unset. *recorded*: written to `environment.<host>.json` and `rank.<rank>.json`.", "",
             "| variable | default | kind | meaning |", "|---|---|---|---|"]
    for var in envvars.VARS:
        default = f"`{var.default}`" if var.default else ""
        kind = kinds.get(var.kind, var.kind) + ("; recorded" if var.recorded else "")
        lines.append(f"| `{var.name}` | {default} | {kind} | {_md(var.meaning)} |")
    return lines + [""]


def render_reference() -> str:
    """The whole reference page, as Markdown."""
    root = click.Context(main, info_name="sbench")
    commands = _commands(main, root)
    lines = HEADER.splitlines() + [""]
    lines += ["## Commands", ""]
    for cmd, ctx in commands:
        top = ctx.parent is root and ctx.info_name in COMMANDS
        summary = COMMANDS[ctx.info_name or ""][1] if top else cmd.get_short_help_str(200)
        lines.append(f"- [`{ctx.command_path}`](#{_anchor(ctx.command_path)}): {_md(summary)}")
    lines += [""] + _section(main, root)
    for cmd, ctx in commands:
        lines += _section(cmd, ctx)
    lines += _envvars()
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    click.echo(render_reference(), nl=False)
