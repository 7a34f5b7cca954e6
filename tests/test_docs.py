"""Every command shown in README.md and docs/*.md works, so the docs cannot drift from the code.

Each ```bash/```console block is one test: its `hetsim ...` lines run in order, in-process through
hetsim.cli.main, in a fresh folder (so `--out` writes there and a later line can read an earlier
line's output); paths that name a file of this repository are made absolute. How each subcommand is
checked:
  run as shown  simulate (and bare `hetsim`), import, profile --no-measure;
  run, overrides appended  plan (`--jobs 1`: one simulation process on a shared CI machine),
                sweep (`--workers 1 --quiet`: no Dask cluster to start);
  parsed only   validate, and profile without --no-measure: they measure this host for minutes.
                Parsing uses build_parser().parse_args, and every input file they name must exist.
A command using a feature still being added (PENDING) is skipped while hetsim lacks that subcommand,
option or choice, and runs once it is there. `python script.py` / `python -m module` / `torchrun -m module` lines must name a script or
module that exists. ```python blocks are executed, except those that spawn executor ranks
(`executor.launch`), which are compiled only. ```json/```yaml blocks must parse, and a plan among them
must simulate on the default cluster and profile.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from hetsim.cli import SUBCOMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
PARSE_ONLY = {"validate"}
OVERRIDES = {"plan": ["--jobs", "1"], "sweep": ["--workers", "1", "--quiet"]}
# Subcommands, options and schedule names that other work is adding (issues 17, 19, 20).
PENDING = ("sweep", "--objective", "time-to-accuracy", "1f1b-interleaved", "zb-h1")
INPUT_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".py")


def _blocks(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """(id, text) of every fenced block of these languages, id = file:line."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) in kinds:
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{doc.relative_to(ROOT)}:{line}", m.group(2)))
    return found


def _commands(block: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines joined, `$ ` prompts and comments dropped,
    `a && b` split into two commands."""
    joined = re.sub(r"\\\n", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not line:
            continue
        words = shlex.split(line.removeprefix("$ "), comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


SHELL_BLOCKS = _blocks(("bash", "console", "sh", "shell"))
PYTHON_BLOCKS = _blocks(("python",))
DATA_BLOCKS = _blocks(("json", "yaml"))


def _hetsim_argv(words: list[str], here: Path) -> list[str]:
    """The arguments after `hetsim`, with repository paths made absolute (never an --out value)."""
    argv = []
    for i, word in enumerate(words[1:]):
        after_out = i > 0 and words[i] == "--out"
        if not after_out and "/" in word and not word.startswith("-") and (ROOT / word).exists() \
                and not (here / word).exists():
            word = str(ROOT / word)
        argv.append(word)
    return argv


def _normalised(argv: list[str]) -> list[str]:
    """What main() parses: `hetsim [options]` means `hetsim simulate [options]`."""
    return argv if argv and argv[0] in SUBCOMMANDS else ["simulate", *argv]


def _parses(argv: list[str]) -> bool:
    try:
        build_parser().parse_args(_normalised(argv))
    except SystemExit as exc:
        return exc.code in (0, None)
    return True


def _known(word: str, argv: list[str]) -> bool:
    """Whether hetsim has this pending word yet: a subcommand, an option of the subcommand, or one
    of its options' choices."""
    if word == "sweep" or word not in argv[1:]:
        return word in SUBCOMMANDS
    sub = _normalised(argv)[0]
    actions = build_parser()._subparsers._group_actions[0].choices[sub]._actions
    return any(word in a.option_strings or word in (a.choices or ()) for a in actions)


def _pending(argv: list[str]) -> str | None:
    """Why a command that uses a feature still being added cannot run yet, or None."""
    missing = [word for word in PENDING if word in argv and not _known(word, argv)]
    return f"not in hetsim yet: {', '.join(missing)}" if missing else None


def _check_other(words: list[str]) -> None:
    """A non-hetsim line must name a script or module that exists (pip lines are left alone)."""
    if words[0] == "python" and len(words) > 1:
        if words[1] == "-m":
            assert importlib.util.find_spec(words[2]) is not None, f"no module {words[2]}"
        elif words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"no script {words[1]}"
    elif words[0] == "torchrun":
        module = words[words.index("-m") + 1]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"


def _run_hetsim(argv: list[str], here: Path, capsys) -> None:
    sub = _normalised(argv)[0]
    measures = sub in PARSE_ONLY or (sub == "profile" and "--no-measure" not in argv)
    if measures:
        assert _parses(argv), f"does not parse: hetsim {' '.join(argv)}"
        inputs = [w for i, w in enumerate(argv) if w.endswith(INPUT_SUFFIXES) and "/" in w
                  and (i == 0 or argv[i - 1] != "--out")]
        for word in inputs:
            assert Path(word).exists() or (here / word).exists(), f"no such file: {word}"
        return
    code = main([*argv, *OVERRIDES.get(sub, [])])
    _, err = capsys.readouterr()
    assert code == 0, f"hetsim {' '.join(argv)} exited {code}:\n{err[-2000:]}"


@pytest.mark.parametrize("block", [b for _, b in SHELL_BLOCKS], ids=[i for i, _ in SHELL_BLOCKS])
def test_every_shell_command_in_the_docs_runs(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = _commands(block)
    reasons = [_pending(_hetsim_argv(words, tmp_path)) for words in commands if words[0] == "hetsim"]
    reasons = [r for r in reasons if r]
    if reasons:
        pytest.skip("; ".join(reasons))
    for words in commands:
        if words[0] == "hetsim":
            _run_hetsim(_hetsim_argv(words, tmp_path), tmp_path, capsys)
        else:
            _check_other(words)


@pytest.mark.parametrize("block", [b for _, b in PYTHON_BLOCKS], ids=[i for i, _ in PYTHON_BLOCKS])
def test_every_python_example_in_the_docs_runs(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = compile(block, "<docs>", "exec")
    if "executor.launch" in block:       # spawns torch.distributed ranks for a plan file: compiled only
        return
    exec(code, {"__name__": "__docs__"})


@pytest.mark.parametrize("block", [b for _, b in DATA_BLOCKS], ids=[i for i, _ in DATA_BLOCKS])
def test_every_file_example_in_the_docs_parses_and_a_plan_simulates(block, tmp_path, capsys):
    data = yaml.safe_load(block)               # JSON is YAML too
    assert isinstance(data, dict)
    if "virtual_workers" in data:              # a plan: it runs on the default cluster and profile
        (tmp_path / "plan.json").write_text(json.dumps(data))
        assert main(["simulate", "--plan", str(tmp_path / "plan.json"), "--waves", "4"]) == 0, \
            capsys.readouterr().err


def test_the_docs_show_commands_for_every_subcommand():
    shown = {_normalised(_hetsim_argv(w, ROOT))[0]
             for _, block in SHELL_BLOCKS for w in _commands(block) if w[0] == "hetsim"}
    assert set(SUBCOMMANDS) <= shown, set(SUBCOMMANDS) - shown


def test_the_readme_shows_what_the_built_in_example_prints(capsys):
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"^```\n(prediction: .*?)^```", readme, re.M | re.S).group(1).splitlines()
    assert main([]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:len(shown)] == shown


def test_readme_is_short_and_every_relative_link_resolves():
    assert (ROOT / "README.md").stat().st_size <= 10 * 1024
    broken = []
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text, f"{doc.name} points at ../shared, which a clone lacks"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and "://" not in path and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_command_extraction_joins_continuations_and_splits_chains():
    block = "pip install -e . && hetsim   # install, simulate\nhetsim plan --cluster c \\\n    --out p.json\n"
    assert _commands(block) == [["pip", "install", "-e", "."], ["hetsim"],
                                ["hetsim", "plan", "--cluster", "c", "--out", "p.json"]]
