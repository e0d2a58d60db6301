"""Exit codes, and the one mapping from loadkit's errors to them (used by every entry point:
`loadkit ...` and plain `locust -f` through the locustfile).

0 success, 1 the run itself failed, 2 bad input or unusable target, 130 / 143 interrupted by
SIGINT / SIGTERM.
"""

from __future__ import annotations

import sys

from loadkit.errors import LoadkitError, ScenarioError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


def err(message: str) -> None:
    print(f"loadkit: {message}", file=sys.stderr)


def report_error(exc: LoadkitError) -> int:
    """Print the error as the user should see it (every scenario problem on its own line, no
    traceback) and return the exit code it maps to."""
    if isinstance(exc, ScenarioError):
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        n = len(exc.problems)
        err(f"{n} problem{'s' if n != 1 else ''} found; nothing was sent")
    else:
        err(str(exc))
    return exc.exit_code
