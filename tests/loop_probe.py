"""How long a dashboard server's event loop is held: ``LoopProbe`` runs a task on the server's loop that sleeps
``PROBE_S`` again and again and records how late it wakes; the longest lateness is the longest time anything held
the loop meanwhile (a request, a session's callback, a card's build and serialisation)."""
import asyncio
import threading
import time

PROBE_S = 0.005


class LoopProbe:
    """Records the longest gap beyond ``PROBE_S`` between wake-ups of a task on ``server``'s event loop."""

    def __init__(self, server):
        self.server, self.longest, self.running = server, 0.0, True
        self.started = threading.Event()
        self.gaps, self.t0 = [], time.perf_counter()
        server._loop.call_soon_threadsafe(lambda: server._loop.create_task(self._run()))
        self.started.wait(10)

    async def _run(self):
        self.started.set()
        last = time.perf_counter()
        while self.running:
            await asyncio.sleep(PROBE_S)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - PROBE_S)
            if now - last - PROBE_S > 0.05:       # (when, how long): which step of a test held the loop
                self.gaps.append((round(last - self.t0, 3), round(now - last - PROBE_S, 3)))
            last = now

    def reset(self):
        self.longest = 0.0

    def stop(self):
        self.running = False
        return self.longest
