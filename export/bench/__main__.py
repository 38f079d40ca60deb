"""`python -m export.bench --worker JOB` runs one measurement (bench's worker processes);
`python -m export.bench ARGS...` is `attnzoo bench ARGS...`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"] and len(argv) == 2:
        from .worker import _worker_main

        return _worker_main(argv[1])
    from export.entry import main as entry_main  # the command line, with its one-line errors

    return entry_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
