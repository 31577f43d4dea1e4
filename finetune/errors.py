"""The one exception type the command line turns into a one-line message."""


class FinetuneError(ValueError):
    """A problem with the user's input, stated with its fix.

    The CLI prints ``error: <message>`` and exits with status 2, without a
    traceback. It subclasses ``ValueError`` so that Python callers (and
    ``HfArgumentParser``, which re-raises ``ValueError`` from ``__post_init__``)
    can catch it the usual way.
    """
