"""train.py's command line in front of Hydra: ``--help``, and the config check that runs before anything exists.

`preflight` reads the command line with Hydra's own parser and composes, with Hydra's own loader, the config
of every job the command would run (a ``-m`` sweep expanded the way Hydra's basic sweeper expands it), then
resolves it and runs `check_config` on it, with the run dir named but not made. Whatever fails is one line
on stderr, ``config error: KEY: problem``, and exit code 2, before Hydra creates ``outputs/`` or
``multirun/``, before a W&B run or a dataset exists: Hydra's override-parse and merge errors, unknown
groups and options, misspelt keys (with the nearest key, by ``difflib``), values of the wrong type, and
`ConfigError`. Only then does ``hydra.main`` run, and compose the same config again.

``--help`` lists the config groups with their options and the main keys with their values and one line each
(from the schema, ``lm_demo/config.py``); ``--help-all`` lists every documented key; ``--hydra-help`` is
Hydra's own. ``HYDRA_FULL_ERROR=1`` raises the original exception instead of the one line.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from .config import GROUP_HELP, MODEL_SCHEMAS, ConfigError, ModelConfig, check_config, key_help, register_configs

EXIT_CONFIG_ERROR = 2
WIDTH = 120  # of the help text
_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"

USAGE = """\
Train the demo GPT (a byte-level language model) with or without the fused layers.

usage: python train.py [GROUP=OPTION ...] [KEY=VALUE ...]      one run, in outputs/<date>/<time>/
       python train.py -m KEY=A,B [KEY=C,D ...]                one run per combination, in multirun/<date>/<time>/<n>/

  python train.py                                 the tiny GPT on the stdlib's source, on the CPU in about a minute
  python train.py fused=true                      the same with the fused Triton layers swapped in
  python train.py -m fused=false,true             both, then a comparison table in the sweep dir
  python train.py model=gpt2_small trainer=gpu fused=true     GPT-2 small, bf16, on a GPU
  python train.py model=llama_1b trainer=gpu trainer.devices=2 strategy=fsdp2 data.batch_size=4 fused=true
                                                  a ~1.2B Llama (transformers), FSDP2 over 2 GPUs
  python train.py ckpt_path=last trainer.max_steps=500        continue the newest run to 500 steps"""

FOOTER = """\
more: --help-all (every key), --cfg job (the whole composed config), --hydra-help (Hydra's own options);
      +trainer.NAME=VALUE passes any other Lightning Trainer argument. A config error is one line and exit code 2."""


# ------------------------------------------------------------------------------------------------
# the entry point
# ------------------------------------------------------------------------------------------------
def preflight(argv: Sequence[str], app_file: str, config_path: str = "conf", config_name: str = "train") -> None:
    """Print the help and exit 0, or exit 2 with one line for a config error; return when every job's config
    is valid (or for Hydra's own informational flags, which Hydra handles)."""
    from hydra._internal.utils import get_args_parser

    argv = list(argv)
    show_all = "--help-all" in argv
    argv = [a for a in argv if a != "--help-all"]
    parser = get_args_parser()
    parser.error = fail  # type: ignore[method-assign]  # argparse's usage + message: one line too
    args, unknown = parser.parse_known_args(argv)  # --version prints and exits here, as in Hydra
    if unknown:
        fail(f"{unknown[0]}: unknown option; python train.py --help lists the options")
    if args.hydra_help or args.info or args.shell_completion or args.experimental_rerun:
        return
    register_configs()
    name = args.config_name or config_name
    overrides = list(args.overrides)
    hydra, text = None, None
    try:
        hydra = _create_hydra(app_file, args.config_path or config_path, args.config_dir)
        if args.help or show_all:
            text = help_text(hydra, name, overrides, show_all=show_all, conf_dir=_conf_dir(app_file, config_path))
        for task in [] if text else job_configs(hydra, name, overrides, multirun=args.multirun):
            if args.cfg:  # only showing it: composing is the check
                continue
            OmegaConf.to_container(task, resolve=True)  # every interpolation resolves
            check_config(task)
    except SystemExit:
        raise
    except Exception as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        fail(describe(e, _known_keys(hydra, name), lambda group: _group_options(hydra, group)))
    finally:
        _clear_hydra()
    if text:
        try:
            print(text, flush=True)
        except BrokenPipeError:  # `python train.py --help | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def fail(message: str) -> None:
    """The one line of a config error, and exit code 2."""
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(EXIT_CONFIG_ERROR)


def remove_run_dir(run_dir: str | os.PathLike, job_name: str = "train") -> None:
    """Undo what Hydra made for a run that failed at config time: its ``.hydra/`` and ``<job>.log``, then the
    run dir and its parents up to the working directory while they are empty. Anything else stays."""
    d = Path(run_dir).resolve()
    shutil.rmtree(d / ".hydra", ignore_errors=True)
    (d / f"{job_name}.log").unlink(missing_ok=True)
    cwd = Path.cwd().resolve()
    while d != cwd and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        if cwd not in d.parents:  # a run dir outside the working directory: only the dir itself
            break
        d = d.parent


# ------------------------------------------------------------------------------------------------
# composing as Hydra will
# ------------------------------------------------------------------------------------------------
def _conf_dir(app_file: str, config_path: str) -> Path:
    return (Path(app_file).resolve().parent / config_path).resolve()


def _create_hydra(app_file: str, config_path: str, config_dir: str | None) -> Any:
    """The `Hydra` object ``hydra.main`` would create for ``app_file`` (same search path, ``--config-dir`` too)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    search_path = create_automatic_config_search_path(str(Path(app_file).resolve()), None, config_path)
    if config_dir is not None:
        abs_dir = os.path.abspath(config_dir)
        if not os.path.isdir(abs_dir):
            raise ConfigError(f"--config-dir: {abs_dir!r}: no such directory")
        search_path.prepend(provider="command-line", path=f"file://{abs_dir}",
                            anchor=SearchPathQuery(provider="schema"))
    return Hydra.create_main_hydra2(task_name=Path(app_file).stem, config_search_path=search_path)


def _clear_hydra() -> None:
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()


def job_configs(hydra: Any, config_name: str, overrides: list[str], multirun: bool = False) -> Iterator[DictConfig]:
    """Each job's task config (no ``hydra`` node), with Hydra's runtime set as for that job (``output_dir``
    resolves to its run dir, which is not created). A multirun under the basic sweeper yields one config per
    combination of the sweep; under another sweeper (which picks its own values) the config as composed."""
    from hydra.types import RunMode

    if not multirun:  # a run, unless the config itself says hydra.mode=MULTIRUN (then a sweep needs no -m)
        try:
            cfg = hydra.compose_config(config_name, overrides, run_mode=RunMode.RUN)
        except Exception:
            if hydra.get_mode(config_name=config_name, overrides=overrides) != RunMode.MULTIRUN:
                raise
            cfg = None
        if cfg is not None and cfg.hydra.mode != RunMode.MULTIRUN:
            yield _as_job(cfg, "hydra.run.dir")
            return
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    master = hydra.compose_config(config_name, overrides, run_mode=RunMode.MULTIRUN)
    if master.hydra.sweeper.get("_target_") != _BASIC_SWEEPER:
        yield _as_job(_sweep_job(master, 0), None)
        return
    params = [f"{k}={v}" for k, v in (master.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(
        params + list(master.hydra.overrides.task))
    for num, job_overrides in enumerate(BasicSweeper.split_arguments(parsed, None)[0]):
        yield _as_job(_sweep_job(hydra.config_loader.load_sweep_config(master, list(job_overrides)), num), None)


def _sweep_job(cfg: DictConfig, num: int) -> DictConfig:
    with open_dict(cfg), read_write(cfg):
        cfg.hydra.job.num = num
        cfg.hydra.job.id = f"preflight_{num}"
    return cfg


def _as_job(cfg: DictConfig, dir_key: str | None) -> DictConfig:
    """As Hydra's ``run_job`` does, without making the dir: runtime.output_dir set, then the task config."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    if dir_key:
        run_dir = str(OmegaConf.select(cfg, dir_key))
    else:
        run_dir = str(Path(cfg.hydra.sweep.dir) / str(cfg.hydra.sweep.subdir))
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = os.path.abspath(run_dir)
    HydraConfig.instance().set_config(cfg)
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


# ------------------------------------------------------------------------------------------------
# one line per error
# ------------------------------------------------------------------------------------------------
def describe(e: BaseException, keys: Sequence[str] = (), group_options: Any = lambda group: []) -> str:
    """``KEY: problem`` for an exception raised while composing, resolving or checking the config."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(e, ConfigError):
        return str(e)
    if isinstance(e, OverrideParseException):
        key = _key_of(e.override)
        problem = _first_line(e.message)
        return f"{key}: cannot read {e.override!r} ({problem}); quote a value that has spaces or brackets"
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = list(e.options or group_options(group))
        if not options:
            return f"{group.replace('/', '.')}: no such config group" + _did_you_mean(group, keys)
        hint = _did_you_mean(option, options)
        return f"{group.replace('/', '.')}: no option {option!r}{hint} (options: {', '.join(options)})"
    cause = e if isinstance(e, OmegaConfBaseException) else e.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        return f"{cause.full_key}: {_omegaconf_problem(cause, keys)}"
    msg = str(e)
    if m := re.search(r"An item is already at '([^']+)'", msg):
        return f"{m[1]}: already in the config: set it without the leading + ({m[1]}=...)"
    if m := re.search(r"Could not delete from config\. '([^']+)' does not exist", msg):
        return f"{m[1]}: nothing to delete{_did_you_mean(m[1], keys)}"
    if m := re.search(r"Could not override '([^']+)'", msg):
        return f"{m[1]}: {_no_such_key(m[1], keys)}"
    if m := re.search(r"(?:Ambiguous value for argument|Sweep parameters) '([^=']+)=([^']*)'", msg):
        key, value = _key_of(m[1]), m[2]
        return f"{key}: {value!r} is a sweep: add -m to run one job per value (or write {key}=[{value}] for a list)"
    if m := re.search(r"Sweeping over Hydra's configuration is not supported : '([^=']+)=", msg):
        return f"{m[1]}: Hydra's own settings cannot be swept"
    return _first_line(msg) or type(e).__name__


def _omegaconf_problem(e: OmegaConfBaseException, keys: Sequence[str]) -> str:
    key, msg = e.full_key, _first_line(getattr(e, "msg", None) or str(e))
    if isinstance(e, ConfigKeyError) or re.match(r"Key '.*' (not in|is not in struct)", msg):
        return _no_such_key(key, keys)
    if m := re.match(r"Value '(.*)' is not a valid bool", msg):
        return f"{m[1]!r} is not a bool (true or false)"
    if m := re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", msg):
        return f"{m[1]!r} is not allowed (allowed: {m[2]})"
    if re.match(r"Invalid value assigned: \w+ is not a ListConfig", msg):
        return f"not a list (write {key}=[A,B])"
    if m := re.match(r"Value '(.*)' of type '.*' could not be converted to (\w+)", msg):
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "a bool (true or false)"}.get(m[2], m[2])
        return f"{m[1]!r} is not {kind}"
    return msg


def _no_such_key(key: str, keys: Sequence[str]) -> str:
    if "/" in key:
        hint = _did_you_mean(key.split("/")[0], keys)
        return "no such config group" + (hint or "; python train.py --help lists them")
    hint = _did_you_mean(key, keys)
    if not hint and key.startswith("trainer."):
        hint = f" (another Lightning Trainer argument: +{key}=VALUE)"
    return "no such key" + (hint or "; python train.py --help lists the keys")


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    """``; did you mean X?`` with the nearest candidate, else ``""``: the same last name under another parent
    (``model.batch_size`` -> ``data.batch_size``), else a sibling with a close name (``trainer.max_step`` ->
    ``trainer.max_steps``), else a close last name anywhere. Hydra's own keys only for a word starting hydra."""
    candidates = [c for c in candidates if c != word and (word.startswith("hydra") or not c.startswith("hydra"))]
    parent, _, leaf = word.rpartition(".")
    by_leaf: dict[str, list[str]] = {}
    for c in candidates:
        by_leaf.setdefault(c.rpartition(".")[2], []).append(c)
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    if len(by_leaf.get(leaf, [])) == 1:  # the right name under another parent
        return f"; did you mean {by_leaf[leaf][0]}?"
    if best := difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6):
        return f"; did you mean {siblings[best[0]]}?"
    if (best := difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.8)) and len(by_leaf[best[0]]) == 1:
        return f"; did you mean {by_leaf[best[0]][0]}?"
    return ""


def _key_of(override: str) -> str:
    return re.sub(r"@.*$", "", re.split(r"=", override.lstrip("~+"), maxsplit=1)[0]).strip() or override


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


# ------------------------------------------------------------------------------------------------
# what the config holds: keys, groups, values
# ------------------------------------------------------------------------------------------------
def _compose_plain(hydra: Any, config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    from hydra.types import RunMode

    return hydra.compose_config(config_name, list(overrides), run_mode=RunMode.RUN)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out[key] = v
            out.update(_flatten(v, key + "."))
    return out


def _known_keys(hydra: Any, config_name: str) -> list[str]:
    """Every key of the default config (Hydra's own included), for "did you mean"."""
    if hydra is None:
        return []
    try:
        cfg = _compose_plain(hydra, config_name)
        return list(_flatten(OmegaConf.to_container(cfg, resolve=False)))
    except Exception:
        return []


def _group_options(hydra: Any, group: str) -> list[str]:
    if hydra is None:
        return []
    try:
        return sorted(hydra.config_loader.get_group_options(group))
    except Exception:
        return []


def _first_comment(path: Path) -> str:
    """The first comment line of a yaml file: each option's one-line description."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("#") and not line.startswith("# @"):
                return line.lstrip("#").strip()
            if line.strip() and not line.startswith("#"):
                break
    except OSError:
        pass
    return ""


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{...}" if value else "{}"
    return str(getattr(value, "value", value))


def help_text(hydra: Any, config_name: str, overrides: Sequence[str] = (), show_all: bool = False,
              conf_dir: Path | None = None) -> str:
    """Usage, the config groups with their options (``*``: selected), and the main keys (``show_all``: every
    documented key) with their current value and one line each."""
    cfg = _compose_plain(hydra, config_name, overrides)
    choices = dict(cfg.hydra.runtime.choices)
    values = _flatten(OmegaConf.to_container(cfg, resolve=False))
    lines = [USAGE, "", "config groups (GROUP=OPTION; * = selected):"]
    for group in [g for g in GROUP_HELP if _group_options(hydra, g)]:
        lines.append(f"  {group:<10} {GROUP_HELP[group]}")
        for option in _group_options(hydra, group):
            mark = "*" if choices.get(group) == option else " "
            desc = _first_comment(conf_dir / group / f"{option}.yaml") if conf_dir else ""
            lines.append(f"    {mark} {option:<12} {desc}"[:WIDTH])
    title = "keys" if show_all else "main keys"
    lines += ["", f"{title} (KEY=VALUE; the value now):"]
    model_schema = MODEL_SCHEMAS.get(str(values.get("model._target_")), ModelConfig)  # the selected model's keys
    rows = [(key, _fmt(values[key]), desc) for key, (desc, main) in key_help(model=model_schema).items()
            if (main or show_all) and key in values]
    kw, vw = max(len(r[0]) for r in rows) + 2, min(max(len(r[1]) for r in rows), 12) + 2
    indent = " " * (2 + kw + vw)
    for key, value, desc in rows:
        head = f"  {key:<{kw}}{value} "
        if len(head) > len(indent):  # a long value: the description on the next line
            lines.append(head.rstrip())
            head = indent
        lines += textwrap.wrap(desc, width=WIDTH, initial_indent=head.ljust(len(indent)), subsequent_indent=indent)
    lines += ["", FOOTER]
    return "\n".join(lines)
