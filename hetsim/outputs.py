"""How hetsim writes what it produces: whole files or none, and a command's several files together.

A file is written beside its destination and moved into place, so a failure (a full disk, a folder
where the file should go) leaves neither half a file nor a clobbered earlier one; missing folders on
the way are made (the commands check first that they can be: hetsim.cli.arguments). A file that
exists keeps its mode; a link is followed; a destination that is no regular file (/dev/null, a pipe)
is written into, not replaced. A command that writes several files into one folder (a report and its
figures, an import's cluster, profile and plan) writes them into a staging folder there and moves
them in only once all are written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

from hetsim.errors import HetsimError

__all__ = ["write_text", "staged"]


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole (utf-8), making its folder; a HetsimError naming it if it cannot."""
    path = Path(path)
    try:
        target = Path(os.path.realpath(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise IsADirectoryError(21, "a folder is in the way", str(path))
        if target.exists() and not target.is_file():      # a device or a pipe: write into it
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            return
        _replace(target, text)
    except OSError as exc:
        raise HetsimError(f"{path}: cannot write it ({exc.strerror or exc})") from None


def _replace(target: Path, text: str) -> None:
    # Opened as any new file is (the umask's mode), under a name no other writer uses.
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as f:
            f.write(text)
        if target.exists():
            os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged(out: str | Path, flag: str = "--out", owns: tuple[str, ...] = ()) -> Iterator[Path]:
    """A folder to write a command's files into; when the block ends they are moved into `out` together
    (replacing files of the same names), unless one of their names is a folder in `out`, which is then
    refused before any is moved. If the block raises, `out` gets none of them (and a folder made for
    them is removed); errors name `out`, not the staging folder. `owns`: every name the command may
    write; one of them left in `out` by an earlier run and not written this time (a figure, with
    --no-plots) is removed with the move, so that no file there contradicts the ones beside it."""
    out = Path(out)
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".hetsim-staging-", dir=out))
    except OSError as exc:
        raise HetsimError(f"{flag} {out}: cannot write there ({exc.strerror or exc})") from None
    moved: list[str] = []
    finished = False
    try:
        yield stage
        names = sorted(p.name for p in stage.iterdir())
        for name in names:
            if (out / name).is_dir():
                raise HetsimError(f"{flag} {out}: {name} there is a folder, where this writes a file; move it "
                                  "or write elsewhere (nothing was written)")
        for name in names:
            os.replace(stage / name, out / name)
            moved.append(name)
        for name in sorted(set(owns) - set(names)):
            if (out / name).is_file():
                (out / name).unlink()
        finished = True
    except HetsimError as exc:
        raise type(exc)(str(exc).replace(str(stage), str(out))) from None
    except OSError as exc:
        name = Path(exc.filename).name if exc.filename else "there"
        done = f"; {', '.join(moved)} moved in before it" if moved else " (nothing was written)"
        raise HetsimError(f"{flag} {out}: cannot write {name} ({exc.strerror or exc}){done}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not finished and not moved:
            with contextlib.suppress(OSError):
                out.rmdir()
