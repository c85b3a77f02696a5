"""The ``flowlab`` command: ``flowlab demo`` (train the digits MLP, log summaries, show them live) and
``flowlab serve LOGDIR`` (the dashboard for a logdir; ``--logdir LOGDIR`` too); ``flowlab --version`` prints the
version. Without a command it prints its help and exits with status 2, as argparse does for other usage errors."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import numpy as np


def _serve(args):
    from flowlab.dashboard.server import serve
    from flowlab.summary.tailer import LogdirError
    if args.logdir is not None and args.logdir_arg is not None and args.logdir != args.logdir_arg:
        print(f"flowlab serve: two logdirs given, {args.logdir_arg!r} and --logdir {args.logdir!r}; give one",
              file=sys.stderr)
        return 2
    logdir = args.logdir if args.logdir is not None else args.logdir_arg
    if logdir is None:
        print("flowlab serve: which logdir? give it as flowlab serve LOGDIR (or --logdir LOGDIR)", file=sys.stderr)
        return 2
    try:
        serve(logdir, port=args.port, host=args.host, reload_interval=args.reload_interval,
              out=lambda line: print(line, flush=True), samples=args.samples_per_plugin)
    except LogdirError as e:            # its message names the logdir, credentials redacted
        print(f"flowlab serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"flowlab serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    _exit_now(0)


def _exit_now(code):
    """Leave at once, once nothing of this process is left to save but its standard streams. Interpreter teardown
    would wait for a server thread still inside a page build and, with Bokeh and NumPy loaded, takes seconds on a
    busy machine by itself: leaving now keeps Ctrl-C under a second."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait_for_interrupt():
    """Block until Ctrl-C or SIGTERM (the dashboard thread keeps serving meanwhile)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


# The demo's pace with its dashboard: slow enough to watch the curves grow; about a minute for its default epochs.
DEMO_PACE = 15
DEMO_EPOCHS = 60


def _demo(args):
    from .examples import digits_mlp
    logdir = os.path.join(args.logdir, time.strftime("%Y%m%d-%H%M%S"))
    server = None
    if not args.no_serve:
        # In a child process: a page's work (building plots, serialising them) then never takes the interpreter
        # from the training loop, which keeps its speed with a page open.
        from flowlab.dashboard.server import ServerProcess, exposure_warning
        try:
            server = ServerProcess(args.logdir, port=args.port, host=args.host)
        except OSError as e:
            print(f"flowlab demo: cannot listen on {args.host}:{args.port}: {e.strerror or e} "
                  f"(try --port 0, or --no-serve)", file=sys.stderr)
            return 1
        if exposure_warning(args.host):
            print(exposure_warning(args.host))
        print(f"flowlab dashboard for {os.path.abspath(args.logdir)} at {server.url}", flush=True)
    from . import device
    print(device(), flush=True)
    pace = args.pace if args.pace is not None else (None if args.no_serve else DEMO_PACE)
    print(f"flowlab demo: training an MLP on the bundled 8x8 digits for {args.epochs} epochs"
          + (f", {pace:g} steps a second" if pace else "") + f"; summaries in {logdir}", flush=True)
    try:
        acc = digits_mlp.main(epochs=args.epochs, batch_size=args.batch_size, logdir=logdir, pace=pace or None)
        print(f"final test accuracy {acc:.3f}", flush=True)
        # A second, short run with a classic bug, so the Anomalies tab (and the red ticks on Scalars) have something
        # real to show: the textbook cross-entropy takes log(softmax), which underflows to log(0) at lr 3.
        print(f"flowlab demo: a second run, {logdir}-naive-loss, takes log(softmax(logits)) as its loss and turns "
              "NaN within a few steps: see the Anomalies tab", flush=True)
        with np.errstate(all="ignore"):          # its NaN are the point: no NumPy warnings about them
            digits_mlp.main(epochs=1, batch_size=args.batch_size, logdir=logdir + "-naive-loss", lr=3.0,
                            naive_loss=True, log=lambda line: None)
        if server is not None:
            print(f"still serving the dashboard at {server.url}  (Ctrl-C to stop)", flush=True)
            _wait_for_interrupt()
            server.stop(timeout=0.5)
            _exit_now(0)            # the summaries are closed: nothing left to save
    except KeyboardInterrupt:
        print("flowlab demo: interrupted", file=sys.stderr)
        return 130
    finally:
        if server is not None:
            server.stop()
    return 0


def _samples(text):
    from flowlab.dashboard.store import parse_samples
    try:
        return parse_samples(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--samples-per-plugin: ")) from None


def _positive_seconds(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="flowlab",
        description="See inside a network while it trains: OneFlow-0.x-style jobs on CuPy/NumPy.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"flowlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="train a small model on bundled data, log summaries and show them live")
    demo.add_argument("--epochs", type=int, default=DEMO_EPOCHS,
                      help=f"passes over the training set (default {DEMO_EPOCHS})")
    demo.add_argument("--pace", type=float, default=None, metavar="STEPS",
                      help=f"at most this many training steps a second (default {DEMO_PACE} with the dashboard, so it "
                           "can be watched live, as fast as it goes with --no-serve; 0: as fast as it goes)")
    demo.add_argument("--batch-size", type=int, default=100, help="examples per step (default 100)")
    demo.add_argument("--logdir", default="runs",
                      help="summaries go to LOGDIR/<timestamp> and LOGDIR/<timestamp>-naive-loss (default runs)")
    demo.add_argument("--no-serve", action="store_true", help="only train; do not start the dashboard")
    demo.add_argument("--port", type=int, default=6006, help="dashboard port (default 6006; 0 picks a free one)")
    demo.add_argument("--host", default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    demo.set_defaults(run=_demo)

    serve = sub.add_parser("serve", help="the live dashboard for a logdir of TensorBoard event files")
    logdir_help = ("folder of runs (any folder holding *tfevents* files), or an fsspec URL such as "
                   "s3://bucket/prefix (pip install 'flowlab[s3]'); not http(s)://, which cannot list a "
                   "folder. Credentials in a URL are never printed or shown")
    serve.add_argument("logdir_arg", nargs="?", metavar="LOGDIR", help=logdir_help)
    serve.add_argument("--logdir", help="the same as LOGDIR, as TensorBoard takes it")
    serve.add_argument("--port", type=int, default=6006, help="port (default 6006; 0 picks a free one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; anything else exposes the logs)")
    serve.add_argument("--reload-interval", type=_positive_seconds, default=0.25, metavar="SECONDS",
                       help="how often the logdir is polled (default 0.25; a logdir that takes longer to poll is "
                            "polled less often, so polling stays under a fifth of a core)")
    serve.add_argument("--samples-per-plugin", type=_samples, default={}, metavar="KIND=N,...",
                       help="items kept per series of each kind, e.g. images=20,histograms=100 (defaults: "
                            "histograms 500, images 10, audio 10, text 100, tensors 10); scalars keep every point")
    serve.set_defaults(run=_serve)

    args = parser.parse_args(argv)
    if args.command is None:                # a usage error: scripts must not take it for a successful run
        parser.print_help(sys.stderr)
        return 2
    if args.command == "demo" and (args.epochs <= 0 or args.batch_size <= 0):
        parser.error("--epochs and --batch-size must be positive")
    if args.command == "demo" and args.pace is not None and not args.pace >= 0:
        parser.error(f"--pace must be a number of steps a second >= 0, got {args.pace}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
