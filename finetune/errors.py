"""The one exception type the command line turns into a one-line message, and the line it quotes of a cause."""


class FinetuneError(ValueError):
    """A problem with the user's input, stated with its fix.

    The CLI prints ``error: <message>`` and exits with status 2, without a
    traceback. It subclasses ``ValueError`` so that Python callers (and
    ``HfArgumentParser``, which re-raises ``ValueError`` from ``__post_init__``)
    can catch it the usual way.
    """


class StoppedBySignal(Exception):
    """A command stopped on SIGTERM or SIGINT once it had cleaned up; the message says what became of the work.

    The CLI prints the message and exits with ``exit_status`` (130 for
    SIGINT, 143 for SIGTERM, as a shell reports a process ended by them).
    """

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class TrainingInterrupted(StoppedBySignal):
    """Training stopped on a signal after saving a checkpoint; the message says how to resume."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 200 characters), or its type's name if it has none.

    What a one-line ``FinetuneError`` quotes of the library error behind it.
    """
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
