"""What every command module shares: the ``main`` group, its error handling, common options and output
helpers. It imports no command module, so the command modules can import it without a cycle: the group
loads a command's module by name when the command runs (:data:`COMMANDS`)."""

from __future__ import annotations

import errno
import importlib
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from harness import __version__
from harness.contract import envvars
from harness.contract.errors import Interrupted, SbenchError
from harness.contract.paths import Lake, is_lake_text, parse_lake
from harness.spec.schema import is_campaign_ref, is_name

# Each top-level command: the module of harness.cli that defines it, and its one line in ``sbench --help``. A
# command's module is loaded when the command runs, so each command starts with only what it needs: ``sbench
# status`` does not load what ``sbench render`` needs, nor ``render`` what ``status`` needs. ``sbench --help``
# lists the commands from this table and loads none of them (tests/test_startup.py holds every command to its
# import budget); a command's own --help loads its module.
COMMANDS: dict[str, tuple[str, str]] = {
    "inventory": ("inputs", "Inspect and discover the cluster description."),
    "experiments": ("inputs", "The experiment catalog."),
    "plan": ("inputs", "Expand a sweep into points; say which are valid and why not."),
    "render": ("inputs", "Dry run: write the job files submit would use."),
    "prepare": ("prepare", "Make a sweep's datasets, models and token counts ready."),
    "submit": ("jobs", "Submit a sweep: job arrays on SLURM, or a local queue."),
    "retry": ("jobs", "Resubmit a campaign's failed points as new attempts."),
    "status": ("control", "Where every point and attempt of a campaign stands."),
    "cancel": ("control", "Cancel every attempt still queued or running."),
    "collect": ("collect", "Read job dirs and SLURM accounting into the results DB."),
    "query": ("results", "Run read-only SQL against the results database."),
    "best": ("results", "What a search campaign found: its best point."),
    "check": ("results", "Check a campaign against its references (exit 1: failed)."),
    "compare": ("results", "Compare two campaigns point by point (exit 1: regression)."),
    "profile": ("results", "Where a profiled run's steps went, and its top operators."),
    "scaling": ("results", "Why N devices are not N times faster: efficiency by shape."),
    "report": ("report", "Write one self-contained HTML page of plots and tables."),
    "probe": ("cluster", "Probe GPUs, RDMA and GIDs against the inventory."),
    "fabric": ("cluster", "All-reduce and all-gather bandwidth across nodes."),
    "preflight": ("cluster", "Time a matmul and a memory copy on every device."),
    "hosts": ("cluster", "Hosts slow again and again: drain candidates, with evidence."),
    "model": ("data", "Test models built locally (nothing is downloaded)."),
    "dataset": ("data", "Synthetic benchmark datasets and their token counts."),
    "env": ("envs", "Trainer environments: fms-hf-tuning releases, each its own."),
    "export": ("exchange", "Export campaigns as Parquet and a provenance.json."),
    "import": ("exchange", "Import an export, or published measurements."),
    "db": ("store", "The results store: its snapshots, maintenance, and a copy into another."),
}


# Text from a job dir (a reason, an error message, a file or host name) may hold terminal control sequences:
# every C0 and C1 control character, DEL, and the bidirectional overrides are shown as escapes (\x1b) instead
# of reaching the terminal. Line breaks and tabs stay where a message may span lines; a table cell has none.
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
             *range(0x2066, 0x206A)]
_CELL_TABLE = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}
_LINE_TABLE = {c: e for c, e in _CELL_TABLE.items() if c not in (0x09, 0x0A)}


def printable(text: Any, *, lines: bool = True) -> str:
    """*text* safe to print: control characters (ESC included) escaped, never sent to the terminal. With
    *lines*, line breaks and tabs are kept (a message); without, they are escaped too (a table cell)."""
    return str(text).translate(_LINE_TABLE if lines else _CELL_TABLE)


def short(text: str, n: int = 70) -> str:
    """*text* cut to *n* characters (``...`` at the end when cut)."""
    return text if len(text) <= n else text[: n - 3] + "..."


def say(text: Any = "", *, err: bool = False) -> None:
    """Print one message that may hold text from a job dir (see :func:`printable`)."""
    click.echo(printable(text), err=err)


class SbenchGroup(click.Group):
    """Loads a command's module when the command runs (:data:`COMMANDS`), and turns domain errors into one
    clean line and the documented exit code (2 input, 1 runtime)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loading = False
        self._commands: dict[str, click.Command] = {}
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]  # click declares a plain attribute; the property keeps it complete
    def commands(self) -> dict[str, click.Command]:
        """Every command, their modules loaded (what a look at the whole command line expects)."""
        if not self._loading:
            self._load({module for module, _ in COMMANDS.values()})
        return self._commands

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._commands = dict(value)

    def _load(self, modules: set[str]) -> None:
        self._loading = True
        try:
            for name in sorted(modules):
                importlib.import_module(f"harness.cli.{name}")
        finally:
            self._loading = False

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """What a command module's decorators call while it loads."""
        loading, self._loading = self._loading, True
        if (name or cmd.name) in COMMANDS:
            cmd.short_help = COMMANDS[name or cmd.name or ""][1]
        try:
            super().add_command(cmd, name)
        finally:
            self._loading = loading

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``sbench --help``, from :data:`COMMANDS`: no command module is loaded for it."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self._commands:
            self._load({COMMANDS[cmd_name][0]})
        return self._commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SbenchError as exc:
            say(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except Interrupted as exc:  # stopped where it could stop cleanly; exit 128 + the signal
            click.echo(f"sbench: {exc}" + (f"\n{exc.note}" if exc.note else ""), err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("sbench: interrupted by signal 2", err=True)
            ctx.exit(128 + 2)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # the reader went away (`sbench query ... | head`): stop quietly, as Unix tools do
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            except (OSError, ValueError):
                pass
            ctx.exit(SIGPIPE_EXIT)
        except OSError as exc:  # the machine's word (a read-only or full file system, a permission): no bug
            if envvars.DEBUG.get():
                raise
            click.echo(f"Error: {os_error_text(exc)}", err=True)
            ctx.exit(1)
        except Exception as exc:  # noqa: BLE001 - a bug, not the user's mistake: one line, unless asked
            if envvars.DEBUG.get():
                raise
            say(f"Error: internal error: {type(exc).__name__}: {exc} (this is a bug in sbench; "
                "SBENCH_DEBUG=1 shows the traceback)", err=True)
            ctx.exit(1)


SIGPIPE_EXIT = 128 + signal.SIGPIPE  # what a shell shows for a tool stopped by SIGPIPE (141)
_OS_HINTS = {errno.EROFS: "the file system is mounted read-only: pass a --workdir / --db on a writable one",
             errno.EACCES: "you may not write there: fix its permissions or pass another --workdir / --db",
             errno.EPERM: "you may not write there: fix its permissions or pass another --workdir / --db",
             errno.ENOSPC: "the file system is full: free some space and run the command again",
             errno.EDQUOT: "your disk quota is used up: free some space and run the command again"}


def os_error_text(exc: OSError) -> str:
    """An OSError as one plain line: what failed, on which file, and what to do."""
    what = exc.strerror or str(exc)
    hint = _OS_HINTS.get(exc.errno or 0)
    return (f"{exc.filename}: {what}" if exc.filename else what) + (f"; {hint}" if hint else "")


def campaign_name(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """Click callback: a campaign name is an identifier (never a path such as ../x)."""
    if value is not None and not is_name(value) and is_campaign_ref(value):
        raise click.BadParameter(f"{value!r} is a campaign imported from another database (cluster/name): status, "
                                 "retry, cancel and collect act on the campaigns submitted here; query, report, "
                                 "compare and check read it")
    if value is not None and not is_name(value):
        shown = repr(value) if len(value) <= 80 else repr(value[:77] + "...")
        raise click.BadParameter(f"{shown} is not a campaign name (letters, digits, '.', '_', '-'; at most 100)")
    return value


def campaign_ref(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Click callback of the readers' campaign arguments: a name, or ``cluster/name`` for an imported one (one
    value, or a tuple of them)."""
    for v in (value if isinstance(value, tuple) else [value]):
        if v is not None and not is_campaign_ref(v):
            shown = repr(v) if len(v) <= 80 else repr(v[:77] + "...")
            raise click.BadParameter(f"{shown} is not a campaign name (letters, digits, '.', '_', '-'; "
                                     "cluster/name for one imported from another database)")
    return value


class FiniteFloat(click.FloatRange):
    """A number within its range (if any), given as a finite number: ``nan`` passes every range's comparisons
    and ``inf`` an open-ended one, so both are refused here, as the input errors they are."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def inventory_option(f: Any) -> Any:
    return click.option("-i", "--inventory", "inventory", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, envvar=envvars.INVENTORY.name, show_envvar=True,
                        help="Inventory YAML (default: the built-in local inventory).")(f)


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def model_map_option(f: Any) -> Any:
    return click.option("--model-map", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                        envvar=envvars.MODEL_MAP.name, help="YAML of model name -> HF id or local path.")(f)


class DbParam(click.ParamType):
    """``--db``: a DuckDB file (a :class:`~pathlib.Path`), or a shared store ``ducklake:postgres:<conninfo>``
    (kept as its text: :func:`~harness.contract.paths.resolve_db` makes it a Lake, with --db-data, in the
    command)."""

    name = "db"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (Path, Lake)):
            return value
        text = str(value)
        if is_lake_text(text):
            try:
                parse_lake(text)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            return text
        if text.endswith(os.sep) or Path(text).is_dir():
            self.fail(f"{text!r} is a directory; --db names a DuckDB file (or ducklake:postgres:<conninfo>)",
                      param, ctx)
        return Path(text)


def _set_db_data(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    # One home for the data directory: the environment resolve_db reads, which the processes this command
    # starts (a campaign's feeder, a --wait's collect) inherit with it.
    if value is not None:
        os.environ[envvars.DB_DATA.name] = str(value.resolve())


def db_option(f: Any, *, from_env: bool = True, help: str | None = None) -> Any:
    """``--db`` (from $SBENCH_DB unless *from_env* is false) and ``--db-data``."""
    f = click.option("--db-data", type=click.Path(file_okay=False, path_type=Path), default=None, is_eager=True,
                     expose_value=False, callback=_set_db_data,
                     help=f"A shared store's data directory (its Parquet files, on NFS or Lustre; "
                          f"${envvars.DB_DATA.name}); needed to create the store, after that the store knows it.")(f)
    return click.option("--db", type=DbParam(), default=None, envvar=envvars.DB.name if from_env else None,
                        help=help or f"DuckDB file (default: {envvars.DB.default}), or a shared store: "
                                     "ducklake:postgres:<libpq conninfo>, e.g. ducklake:postgres:service=sbench.")(f)


def at_option(f: Any) -> Any:
    return click.option("--at", default=None, metavar="SNAPSHOT|TIME",
                        help="Read a shared store as it was at this snapshot (a number: sbench db snapshots lists "
                             "them) or time (2026-11-28T09:30Z), so that an earlier answer can be shown again "
                             "exactly.")(f)


def workdir_option(f: Any) -> Any:
    return click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        envvar=envvars.WORKDIR.name,
                        help=f"Where job directories live (default: {envvars.WORKDIR.default}).")(f)


def sweep_argument(f: Any) -> Any:
    return click.argument("sweep", type=click.Path(exists=True, dir_okay=False, path_type=Path))(f)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


class Progress:
    """Progress of a long command, by phase: a bar per phase on a terminal, one plain line per phase
    (and per change of count) otherwise, nothing when quiet. Call it as ``progress(phase, done, total)``."""

    def __init__(self, prefix: str, labels: dict[str, str] | None = None, quiet: bool = False) -> None:
        self.prefix, self.labels, self.quiet = prefix, labels or {}, quiet
        self.tty = sys.stderr.isatty()
        self.phase: str | None = None
        self.bar: Any = None
        self.done = 0

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.quiet:
            return
        label = f"{self.prefix}: {self.labels.get(phase, phase)}"
        if phase != self.phase:
            self.close()
            self.phase, self.done = phase, 0
            if self.tty:
                self.bar = click.progressbar(length=max(total, 1), label=label, file=sys.stderr, show_pos=True)
                self.bar.__enter__()
            else:
                click.echo(label + (f" ({total})" if total > 1 else ""), err=True)
        if self.bar is not None:
            if done > self.done:
                self.bar.update(done - self.done)
        elif done != self.done and total > 1 and not self.tty:
            click.echo(f"{label}: {done}/{total}", err=True)
        self.done = max(self.done, done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain aligned text table; a cell's control characters are escaped (:func:`printable`)."""
    cells = [[("" if r.get(c) is None else printable(r.get(c), lines=False)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


REPEATS_LINES = 20  # points below their CV target printed at most


def print_repeats(campaign: str, verdicts: list[dict[str, Any]], submitted: int | None = None) -> None:
    """The adaptive repeats of a campaign (``harness.campaign.repeats`` verdicts as dicts): how many points are
    within the CV target, and each one still below it with its repeats and what comes next."""
    if not verdicts:
        return
    below = [v for v in verdicts if v["below_precision"]]
    now = "" if submitted is None else f"; {submitted} more repeat(s) submitted now"
    click.echo(f"repeats of campaign {campaign}: {len(verdicts) - len(below)} of {len(verdicts)} point(s) within "
               f"the CV target, {len(below)} below precision{now}")
    for v in below[:REPEATS_LINES]:
        click.echo(f"  {v['state']:<11}  {v['point_id']}: {printable(v['text'], lines=False)}")
    if len(below) > REPEATS_LINES:
        click.echo(f"  ... and {len(below) - REPEATS_LINES} more (sbench status --json lists them all)")


@click.group(cls=SbenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sbench")
def main() -> None:
    """sbench: benchmark LLM fine-tuning on SLURM or bare metal, then analyse it with SQL.

    Example: sbench plan sweeps/demo-cpu.yaml
    """


# -- inventory ---------------------------------------------------------------------------------------------


def prediction_line(p: dict[str, Any]) -> str | None:
    """A plan's or a submission's predicted totals (``harness.spec.predict``) in one line, with its budget."""
    if not p or not (p.get("points_predicted") or p.get("points_unknown")):
        return None
    budget = p.get("budget") or {}
    spent = p.get("spent_gpu_hours") or 0.0
    limits = [f"{v:g} {k.replace('_', '-')}" for k, v in budget.items() if v is not None]
    return (f"predicted: {p['predicted_seconds'] / 3600:,.3g} allocation hour(s), {p['predicted_gpu_hours']:,.3g} "
            f"GPU-hour(s) for {p['points_predicted']} run(s)"
            + (f"; {p['points_unknown']} run(s) not predicted (nothing like them measured)" if p.get("points_unknown")
               else "")
            + (f"; spent so far {spent:,.3g} GPU-hour(s)" if spent else "")
            + (f"; budget {', '.join(limits)}" if limits else ""))
