"""How long a dashboard server's event loop is held: ``LoopProbe`` runs a task on the server's loop that sleeps
``PROBE_S`` again and again and records how late it wakes; the longest lateness is the longest time anything held
the loop meanwhile (a request, a session's callback, a card's build and serialisation).

Two measures of it:
- ``longest``: wall time. It also counts the other threads and processes that took the loop thread's core (Chromium
  drawing the page, the rest of a shared 2-core machine): a 40 ms turn took 300-400 ms of wall time at load 6.
- ``longest_cpu``: the CPU time of the longest single callback the loop ran (``time.thread_time`` around each of
  the loop thread's ``asyncio`` handles while probing): the loop's own work in one turn, whatever else runs on the
  machine. Measured per callback, not between two wake-ups: a wake-up late on a busy machine finds several turns
  queued before it (a card's build, then its joining), and their sum is no one turn's cost. Bounds on it hold on a
  busy CI machine too.

While it probes, the objects the test process held before it started are frozen out of the garbage collector
(``gc.freeze``): a process that ran hundreds of tests holds millions of them, and one full collection of those, on
whichever thread allocates, is that process's cost, not the server's. The collections that happen are recorded
(``collections``)."""
import asyncio
import asyncio.events
import gc
import threading
import time

PROBE_S = 0.005


class LoopProbe:
    """Records the longest gap beyond ``PROBE_S`` between wake-ups of a task on ``server``'s event loop, in wall time
    (``longest``), the longest CPU time one callback of that loop took (``longest_cpu``); the gaps over 50 ms as
    ``(when, wall, CPU of the gap)``; each garbage collection longer than 10 ms as ``(when, generation, seconds)``."""

    def __init__(self, server):
        self.server, self.longest, self.longest_cpu, self.running = server, 0.0, 0.0, True
        self.started = threading.Event()
        self.gaps, self.collections = [], []
        self._collecting = None
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_collection)
        self.t0 = time.perf_counter()
        self._time_callbacks_on(server._loop)
        server._loop.call_soon_threadsafe(lambda: server._loop.create_task(self._run()))
        self.started.wait(10)

    def _time_callbacks_on(self, loop):
        """Time every callback ``loop`` runs (on its own thread) until ``stop``; other loops' run as before."""
        probe, run = self, asyncio.events.Handle._run
        self._original_run = run

        def timed_run(handle):
            if handle._loop is not loop:
                return run(handle)
            cpu = time.thread_time()
            try:
                return run(handle)
            finally:
                probe.longest_cpu = max(probe.longest_cpu, time.thread_time() - cpu)

        asyncio.events.Handle._run = timed_run

    def _on_collection(self, phase, info):
        now = time.perf_counter()
        if phase == "start":
            self._collecting = now
        elif self._collecting is not None and now - self._collecting > 0.01:
            self.collections.append((round(self._collecting - self.t0, 3), info["generation"],
                                     round(now - self._collecting, 3)))

    async def _run(self):
        self.started.set()
        last, last_cpu = time.perf_counter(), time.thread_time()
        while self.running:
            await asyncio.sleep(PROBE_S)
            now, cpu = time.perf_counter(), time.thread_time()
            late, held = now - last - PROBE_S, cpu - last_cpu
            self.longest = max(self.longest, late)
            if late > 0.05:       # (when, wall, CPU): which step of a test held the loop
                self.gaps.append((round(last - self.t0, 3), round(late, 3), round(held, 3)))
            last, last_cpu = now, cpu

    def reset(self):
        self.longest = self.longest_cpu = 0.0

    def stop(self):
        """Stops probing; returns ``longest`` (wall seconds)."""
        self.running = False
        asyncio.events.Handle._run = self._original_run
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
            gc.unfreeze()
        return self.longest
