"""Train one of analysis's tiny models and write its weights: python scripts/train_tiny.py NAME.

Deterministic: fixed seed and thread count (analysis.training.TRAIN_SEED, the task's threads). The default
output is models/NAME.pt, the file `analysis.load(NAME)` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from analysis import store  # noqa: E402
from analysis.tasks import TASKS, get_task  # noqa: E402
from analysis.training import TRAIN_SEED, train  # noqa: E402
from zoo.progress import bar as progress_bar  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(TASKS))
    p.add_argument("--steps", type=int, default=None, help="default: the task's budget")
    p.add_argument("--seed", type=int, default=TRAIN_SEED)
    p.add_argument("-o", "--output", default=None, help="default models/NAME.pt")
    args = p.parse_args(argv)
    task = get_task(args.name)
    steps = task.steps if args.steps is None else args.steps
    bar = progress_bar(steps, f"train {args.name}", unit="step")

    def progress(step: int, loss: float) -> None:
        bar.update()
        if step % 50 == 0:
            bar.set_postfix_str(f"loss {loss:.3f}")

    model, log = train(task, steps=steps, seed=args.seed, progress=progress)
    bar.close()
    out = Path(args.output) if args.output else Path(__file__).resolve().parent.parent / "models" / f"{args.name}.pt"
    store.save(model, args.name, out, log)
    print(f"wrote {out}: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
