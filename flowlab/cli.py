"""The ``flowlab`` command."""
from __future__ import annotations

import argparse
import sys


def _demo(args):
    from .examples import digits_mlp
    print(f"flowlab demo: training an MLP on the bundled 8x8 digits for {args.epochs} epochs")
    acc = digits_mlp.main(epochs=args.epochs, batch_size=args.batch_size)
    print(f"final test accuracy {acc:.3f}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="flowlab",
        description="See inside a network while it trains: OneFlow-0.x-style jobs on CuPy/NumPy.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="train a small model on bundled data and report progress")
    demo.add_argument("--epochs", type=int, default=20, help="passes over the training set (default 20)")
    demo.add_argument("--batch-size", type=int, default=100, help="examples per step (default 100)")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.epochs <= 0 or args.batch_size <= 0:
        parser.error("--epochs and --batch-size must be positive")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
