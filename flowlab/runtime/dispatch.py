"""The watch dispatcher: one thread that runs watch callbacks off the compute path, in the order they were queued.

Summary events for live widgets (``watch_summary`` handlers, see ``flowlab.watching``) skip it on NumPy: they are a
few numbers already on the host and their handlers only record them, so the plan's thread delivers them as they
are computed (errors go to ``report``), sparing each step a hand-off between threads (~27% of a small step in a
kernel).

The executor copies each watched value to the host as soon as it is computed (before updates change variables);
the call hands its deliveries over as one batch when the plan has run, so the thread wakes once a call. A job call that returns a value waits for its own callbacks
first; a ``-> None`` job returns at once and its callbacks overlap the caller's next work, until the next job call
(which waits for them, keeping the queue bounded) or ``flow.sync_default_session()``. An error raised by a callback
is kept and raised there.

A *trailing* batch (``watch_health`` reports for a handler of the user's) runs while the next call computes: no call
waits for its own trailing batch, the next call starts without waiting for it (``settle``) and waits for it only
once its plan has run (``Deliveries.hand_over``), raising its errors there. So reports overlap the next step on a
second core, at most one call's trailing batch is ever pending, and a handler's error still surfaces in the next call.
"""
from __future__ import annotations

import atexit
import collections
import threading

from ..errors import WatchCallbackError


class Dispatcher:
    def __init__(self):
        self._queue = collections.deque()
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._errors: list[tuple[int, WatchCallbackError]] = []     # (ticket of the batch that raised, error)
        self._trailing = 0          # ticket of the newest trailing batch
        self._running = 0           # ticket of the batch the thread is running
        self._thread = None

    def _ensure_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="flowlab-watch-dispatcher", daemon=True)
            self._thread.start()

    def submit(self, call, describe):
        """Queue ``call()``; ``describe()`` names what it serves if it raises. Returns the ticket to wait for."""
        return self.submit_batch([(call, describe)])

    def submit_batch(self, calls, trailing=False):
        """Queue ``[(call, describe), ...]`` to run in order as one item (one wake-up of the thread); ``trailing``:
        see the module docstring."""
        with self._cond:
            self._ensure_thread()
            self._queue.append(calls)
            self._submitted += 1
            if trailing:
                self._trailing = self._submitted
            self._cond.notify_all()
            return self._submitted

    def _loop(self):
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                calls = self._queue.popleft()
                self._running = self._done + 1
            for call, describe in calls:
                try:
                    call()
                except BaseException as e:  # a handler's failure must reach the user, never kill the dispatcher
                    self.report(describe(), e)
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def report(self, what, exception):
        """Keep ``exception``, raised by the callback ``what``, to raise at the next job call or sync."""
        error = WatchCallbackError(f"{what} raised {type(exception).__name__}: {exception}")
        error.__cause__ = exception
        with self._cond:
            # raised from a batch: that batch's ticket; from a job's own thread: the work queued so far
            ticket = self._running if threading.current_thread() is self._thread else self._submitted
            self._errors.append((ticket, error))

    def ticket(self):
        """The ticket of everything queued so far but a trailing batch that is the newest."""
        with self._cond:
            return self._submitted - (self._trailing == self._submitted and self._submitted > 0)

    def take_trailing(self):
        """The ticket of the newest trailing batch not taken yet (0: none), for its caller to wait for."""
        with self._cond:
            ticket, self._trailing = self._trailing, 0
            return ticket

    def settle(self):
        """Before a job call: wait for every callback queued so far but the newest batch when it is trailing."""
        self.wait(self.ticket())

    def wait(self, ticket=None):
        """Block until every callback queued up to ``ticket`` (default: all so far) has run."""
        if self._done == self._submitted or threading.current_thread() is self._thread:
            return   # nothing pending (the common, unwatched case: no lock); or a handler calling a job
        with self._cond:
            target = self._submitted if ticket is None else ticket
            while self._done < target:
                self._cond.wait()

    def raise_pending(self, upto=None):
        """Raise the first error a callback raised since the last call (the others are chained as context); with
        ``upto``, only errors of batches up to that ticket."""
        if not self._errors:
            return
        with self._cond:
            errors = [e for t, e in self._errors if upto is None or t <= upto]
            self._errors = [(t, e) for t, e in self._errors if upto is not None and t > upto]
        if errors:
            first = errors[0]
            if len(errors) > 1:
                first.args = (f"{first.args[0]} (and {len(errors) - 1} more callback error(s))",)
            raise first


_dispatcher = Dispatcher()


def default() -> Dispatcher:
    return _dispatcher


@atexit.register
def _finish_callbacks_at_exit():
    # A script whose last line calls a `-> None` job still sees that job's watch output.
    _dispatcher.wait()
