"""How long a dashboard server's event loop is held: ``LoopProbe`` runs a task on the server's loop that sleeps
``PROBE_S`` again and again and records how late it wakes; the longest lateness is the longest time anything held
the loop meanwhile (a request, a session's callback, a card's build and serialisation).

Two measures of it:
- ``longest``: wall time. It also counts the other threads and processes that took the loop thread's core (Chromium
  drawing the page, the rest of a shared 2-core machine): a 40 ms turn took 300-400 ms of wall time at load 6.
- ``longest_cpu``: the CPU time the loop's thread spent between two wake-ups (``time.thread_time`` read on the loop's
  thread itself): the loop's own work, whatever else runs on the machine. Bounds on it hold on a busy CI machine too.

While it probes, the objects the test process held before it started are frozen out of the garbage collector
(``gc.freeze``): a process that ran hundreds of tests holds millions of them, and one full collection of those, on
whichever thread allocates, is that process's cost, not the server's. The collections that happen are recorded
(``collections``)."""
import asyncio
import gc
import threading
import time

PROBE_S = 0.005


class LoopProbe:
    """Records the longest gap beyond ``PROBE_S`` between wake-ups of a task on ``server``'s event loop, in wall time
    (``longest``) and in the loop thread's CPU time (``longest_cpu``); the gaps over 50 ms as ``(when, wall, cpu)``;
    each garbage collection longer than 10 ms as ``(when, generation, seconds)``."""

    def __init__(self, server):
        self.server, self.longest, self.longest_cpu, self.running = server, 0.0, 0.0, True
        self.started = threading.Event()
        self.gaps, self.collections = [], []
        self._collecting = None
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_collection)
        self.t0 = time.perf_counter()
        server._loop.call_soon_threadsafe(lambda: server._loop.create_task(self._run()))
        self.started.wait(10)

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
            self.longest, self.longest_cpu = max(self.longest, late), max(self.longest_cpu, held)
            if late > 0.05:       # (when, wall, CPU): which step of a test held the loop
                self.gaps.append((round(last - self.t0, 3), round(late, 3), round(held, 3)))
            last, last_cpu = now, cpu

    def reset(self):
        self.longest = self.longest_cpu = 0.0

    def stop(self):
        """Stops probing; returns ``longest`` (wall seconds)."""
        self.running = False
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
            gc.unfreeze()
        return self.longest
