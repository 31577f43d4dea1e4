"""``python -m finetune ...`` as a real child process, without paying for its imports every time.

A test that runs the command line in a child process (to see its exit status, its standard error, a
signal or a SIGKILL) spent most of that child's time importing: 7 to 10 s of torch, transformers and
datasets on 2 CPU cores, then a second or two of work on the tiny model. Here each test worker keeps one
forkserver (``multiprocessing``'s) that has imported them once, and every child is forked from it:
a process of its own, with its own pid, file descriptors, working directory, environment and
``sys.argv``, running ``finetune``'s ``__main__`` exactly as ``python -m finetune`` does, and ending
as the interpreter would (``SystemExit``'s status, a traceback and 1, threads joined, ``atexit``).

What cannot differ from a fresh interpreter is what the interpreter reads as it starts: the standard
streams' encoding (``PYTHONIOENCODING``, the locale) and flags. Tests of those, and launchers such as
torchrun, start real processes with ``subprocess``. :func:`Popen` and :func:`run` refuse an environment
that changes what is read at import (see ``_READ_AT_IMPORT``).

    from warm_processes import Popen, run
    done = run([sys.executable, "-m", "finetune", "train", recipe], capture_output=True, text=True)
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Imported once by the forkserver, before any child is forked: what a training, predicting or serving
# child would otherwise import itself.
_PRELOAD = [
    "torch",
    "transformers",
    "transformers.trainer",
    "datasets",
    "evaluate",
    "sklearn.linear_model",
    "finetune.cli",
    "finetune.commands.train",
    "finetune.commands.predict",
    "finetune.commands.evaluate",
    "finetune.commands.serve",
    "finetune.training.trainer",
]
# Environment variables that libraries read once, at import: a child given other values than the
# forkserver had would not see them, so such a child is refused instead of silently differing.
_READ_AT_IMPORT = ("PYTHONIOENCODING", "LC_ALL", "LC_CTYPE", "LANG", "HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_CACHE")

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL

_context: Any = None


def _forkserver() -> Any:
    """This process's forkserver context, its imports done in the server before the first fork."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


class Popen:
    """A forked ``python -m MODULE``, ``python -c CODE`` or ``python SCRIPT``, used as :class:`subprocess.Popen` is.

    ``args`` is the command a real process would run: ``[sys.executable, "-m", "finetune", ...]``,
    ``[sys.executable, "-c", code, ...]`` or ``[sys.executable, "path/to/script.py", ...]``, with ``-u``
    allowed first.
    """

    def __init__(
        self,
        args: Sequence[str | os.PathLike],
        *,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        text: bool = False,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.args = [str(arg) for arg in args]
        child_spec = _child_spec(self.args, env, cwd)
        # Called in the child before the command, as subprocess calls it before exec; it travels by pickle,
        # so a module-level function or a functools.partial of one, not a closure.
        child_spec["preexec_fn"] = preexec_fn
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        ends: list[int] = []  # the child's ends, closed here once it has its copies
        try:
            child_stdin, self.stdin = _stream(stdin, 0, text, ends)
            child_stdout, self.stdout = _stream(stdout, 1, text, ends)
            if stderr == STDOUT:
                child_stderr, self.stderr = child_stdout, None
            else:
                child_stderr, self.stderr = _stream(stderr, 2, text, ends)
            streams = [Connection(os.dup(fd)) for fd in (child_stdin, child_stdout, child_stderr)]
            self._process = _forkserver().Process(target=_child_main, args=(child_spec, *streams), daemon=False)
            self._process.start()
            for stream in streams:
                stream.close()
        finally:
            for fd in ends:
                os.close(fd)
        self.pid = self._process.pid

    def poll(self) -> int | None:
        """The exit status if the child has ended (``-N`` for signal N), else None."""
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end and return its exit status; ``subprocess.TimeoutExpired`` past ``timeout``."""
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Write ``input`` to stdin, read stdout and stderr to their ends, wait: as ``subprocess.Popen``'s."""
        outputs: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda name=name, stream=stream: outputs.__setitem__(name, stream.read()))
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None and not stream.closed  # the caller may have closed one, as head does
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # a child that ended without reading it all
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():  # a grandchild still holds the pipe open
                raise subprocess.TimeoutExpired(self.args, timeout)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return outputs.get("stdout"), outputs.get("stderr")

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the child, unless it has already ended."""
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        self.wait()


def run(
    args: Sequence[str | os.PathLike],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    stdout: Any = None,
    stderr: Any = None,
    **popen: Any,
) -> subprocess.CompletedProcess:
    """Run a forked child to its end, as :func:`subprocess.run` does (``check`` is not offered)."""
    if capture_output:
        stdout = stderr = PIPE
    stdin = PIPE if input is not None else popen.pop("stdin", None)
    with Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, **popen) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _child_spec(args: list[str], env: Mapping[str, str] | None, cwd: str | os.PathLike | None) -> dict[str, Any]:
    """What the child runs, where, and with which environment; a command this module cannot fork is refused."""
    if not args or args[0] != sys.executable:
        raise ValueError(f"warm_processes forks Python commands only, not {args[:1]}; use subprocess for it")
    rest, unbuffered = args[1:], False
    if rest[:1] == ["-u"]:  # the one interpreter flag the tests use
        rest, unbuffered = rest[1:], True
    if rest[:1] == ["-m"] and len(rest) >= 2:
        spec = {"module": rest[1], "argv": rest[2:]}
    elif rest[:1] == ["-c"] and len(rest) >= 2:
        spec = {"code": rest[1], "argv": rest[2:]}
    elif rest and not rest[0].startswith("-"):
        spec = {"script": str(Path(rest[0]).resolve()), "argv": rest[1:]}
    else:
        raise ValueError(f"warm_processes runs 'python [-u] -m MODULE | -c CODE | SCRIPT ...', not {args}")
    environment = dict(os.environ if env is None else env)
    changed = [name for name in _READ_AT_IMPORT if environment.get(name) != os.environ.get(name)]
    if changed:
        raise ValueError(f"{', '.join(changed)} would be read at import: run this child with subprocess")
    # As the interpreter reads it at start: -u, or PYTHONUNBUFFERED set to anything.
    unbuffered = unbuffered or bool(environment.get("PYTHONUNBUFFERED"))
    return {**spec, "unbuffered": unbuffered, "env": environment, "cwd": os.fspath(cwd or os.getcwd())}


def _stream(choice: Any, standard_fd: int, text: bool, ends: list[int]) -> tuple[int, Any]:
    """The child's descriptor for standard stream ``standard_fd``, and the parent's file object for PIPE (else None)."""
    mode = "w" if standard_fd == 0 else "r"  # the parent writes the child's stdin, reads its outputs
    if choice == PIPE:
        read_end, write_end = os.pipe()
        child_end, own_end = (read_end, write_end) if mode == "w" else (write_end, read_end)
        ends.append(child_end)
        # Kept open as the Popen's stdin, stdout or stderr, closed by communicate() or on leaving its with.
        own = open(own_end, mode + ("" if text else "b"), **({"encoding": "utf-8"} if text else {}))  # noqa: SIM115
        return child_end, own
    if choice == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        ends.append(fd)
        return fd, None
    if choice is None:  # this process's own
        return standard_fd, None
    if isinstance(choice, int):
        return choice, None
    return choice.fileno(), None


def _child_main(spec: dict[str, Any], stdin: Connection, stdout: Connection, stderr: Connection) -> None:
    """In the forked child: take the streams, environment and directory, run the command, end as Python would."""
    for fd, stream in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(stream.fileno(), fd)
        stream.close()
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    # The forkserver replaced its stdin with /dev/null; each stream is made anew on descriptors 0, 1, 2,
    # buffered as the interpreter buffers them (-u: not at all).
    stdin_bytes = open(0, "rb", closefd=False)  # noqa: SIM115 (the child's stdin for the rest of its life)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(stdin_bytes, encoding="utf-8")
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = open(fd, "wb", buffering=0 if spec["unbuffered"] else -1, closefd=False)  # noqa: SIM115 (as stdin)
        stream = io.TextIOWrapper(
            raw,
            encoding="utf-8",
            errors="backslashreplace" if name == "stderr" else "strict",
            line_buffering=name == "stderr" and not spec["unbuffered"],
            write_through=spec["unbuffered"],
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if spec["preexec_fn"] is not None:
        spec["preexec_fn"]()
    status = 0
    try:
        if "module" in spec:
            sys.argv = [spec["module"], *spec["argv"]]
            sys.path.insert(0, spec["cwd"])  # python -m puts the working directory first
            runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        elif "code" in spec:
            sys.argv = ["-c", *spec["argv"]]
            sys.path.insert(0, "")  # python -c puts the working directory first, as ''
            main_module = types.ModuleType("__main__")  # as the interpreter runs -c: in a module of its own
            sys.modules["__main__"] = main_module
            exec(compile(spec["code"], "<string>", "exec"), main_module.__dict__)
        else:
            sys.argv = [spec["script"], *spec["argv"]]
            sys.path.insert(0, os.path.dirname(spec["script"]))  # python SCRIPT puts the script's folder first
            runpy.run_path(spec["script"], run_name="__main__")
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        # CPython ends on an uncaught KeyboardInterrupt by SIGINT, after its threads and atexit: the parent sees -2.
        _end(0, by_signal=signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    _end(status)


def _exit_status(code: Any) -> int:
    """The status the interpreter gives ``SystemExit(code)``: None is 0, an int itself, anything else printed, 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _end(status: int, by_signal: int | None = None) -> None:
    """Join the threads that are not daemons, run atexit's functions, flush, exit: the interpreter's own order."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon and thread is not threading.current_thread():
            thread.join()
    atexit._run_exitfuncs()
    _flush()
    if by_signal is not None:
        signal.signal(by_signal, signal.SIG_DFL)
        os.kill(os.getpid(), by_signal)
    os._exit(status)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream has nothing to flush
            stream.flush()
