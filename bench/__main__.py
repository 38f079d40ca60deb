"""`python -m bench --worker JOB` runs one measurement in a fresh interpreter (the benchmark's
worker processes). The command line is `attnzoo bench` (cli/cmd_bench.py)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["--worker"] or len(argv) != 2:
        print("usage: python -m bench --worker JOB (a worker of `attnzoo bench`; run that instead)", file=sys.stderr)
        return 2
    from .worker import worker_main

    return worker_main(argv[1])


if __name__ == "__main__":
    sys.exit(main())
