"""Watch delivery, from the requests a trace recorded to the handler calls: all of it here.

1. ``resolve`` (once gradients exist) fixes what each ``watching.WatchRequest`` needs from the plan: the tensor, its
   gradient, their on-device statistics or histogram, or a ``StatsFeed`` put.
2. ``Deliveries`` groups the requests into the plan's ``compiler.Delivery`` list (one host copy serves every request
   on the same tensor and calls), receives the copies the plan emits while it runs (``emit``) and hands them to the
   dispatcher thread in one batch a call (``hand_over``). Summaries for ``watch_summary`` handlers already on the
   host are delivered right in ``emit`` (``runtime.dispatch`` says why).
3. On several devices each replica's plan emits its piece; ``replica_emitters`` collects them and ``join_replicas``
   joins them (``runtime.devices.join``) lazily, in the dispatcher thread.

The generated code that copies a tensor out (``compiler.plan``), the copy itself (``runtime.backend``) and the
thread (``runtime.dispatch``) are the mechanisms this module drives.
"""
from __future__ import annotations

import numpy as np

from .compiler import Delivery
from .errors import TraceError
from .ops.stats import histogram_vector, stats_vector, tensor_stats
from .runtime import backend, devices, dispatch
from .watching import StatsFeed, TensorHistogram, TensorStats, WatchRequest


def resolve(graph, host, devices=1):
    """Fix what each request delivers, once gradients exist: the tensor, its gradient, their on-device stats or
    histogram. ``host``: the plan runs on NumPy, where a feed takes small tensors whole (``StatsFeed.batches``).
    On several ``devices`` every request delivers the tensor itself: summaries are made from the joined whole."""
    kept = []
    for request in _expanded(graph, host, devices):
        target = request.tensor
        if request.diff:
            target = graph.grad_of.get(request.tensor.id)
            if target is None:
                if request.optional:
                    continue
                raise TraceError(f"flow.watch_diff({request.tensor.logical_blob_name}) at {request.source}: the loss "
                                 f"of job {graph.name!r} does not depend on this tensor through any differentiable "
                                 "op, so it has no gradient")
        shape, call = request.tensor.shape, request.call
        if devices > 1:
            _summarise_on_host(request)
        elif request.feed is not None and host and StatsFeed.batches(target):
            request.put = request.feed.put_for(target)
        elif request.stats:
            target = tensor_stats(target)
            if request.feed is not None:
                request.put = request.feed.put
            else:
                request.call = lambda v, step, shape=shape, call=call: call(TensorStats.from_vector(shape, v),
                                                                            step)
        elif request.bins and request.put is None:
            request.call = lambda v, step, shape=shape, call=call: call(TensorHistogram.from_vector(shape, v), step)
        request.target = target
        kept.append(request)
    graph.watches = kept
    return kept


def _expanded(graph, host, devices):
    """The graph's watch requests, a ``watch_health`` request (``flowlab.health``) replaced by those it needs."""
    if all(isinstance(r, WatchRequest) for r in graph.watches):
        return graph.watches
    xp = np if host else backend.current().xp
    return [w for r in graph.watches
            for w in ([r] if isinstance(r, WatchRequest) else r.expand(graph, xp, devices))]


def _summarise_on_host(request):
    """A multi-device request: the plans deliver the tensor; statistics, histograms and feeds are made from the
    joined ``DeviceValues`` in the dispatcher thread."""
    call, feed, bins = request.call, request.feed, request.bins
    if feed is not None:
        request.call = lambda v, step: feed.put(step, stats_vector(np, v.whole))
    elif request.stats:
        request.call = lambda v, step: call(TensorStats.from_vector(v.whole.shape, stats_vector(np, v.whole)), step)
    elif bins:
        request.call = lambda v, step: call(TensorHistogram.from_vector(v.whole.shape,
                                                                        histogram_vector(np, v.whole, bins)), step)
    request.inline = False


def _group(watches, multi_device):
    """``(deliveries, requests)``: one ``Delivery`` a distinct (target, every, when, bins, put), and the requests it
    serves. On several devices a delivery is the tensor itself: one a (target, every)."""
    index, deliveries, requests = {}, [], []
    for request in watches:
        if multi_device:
            delivery = Delivery(request.target, request.every)
        else:
            delivery = Delivery(request.target, request.every, request.when, request.bins, request.put)
        key = (request.target.id, *delivery[1:])
        if key not in index:
            index[key] = len(deliveries)
            deliveries.append(delivery)
            requests.append([])
        requests[index[key]].append(request)
    return deliveries, requests


class Deliveries:
    """The watch deliveries of one compiled signature of a job (see the module docstring).

    ``plan_deliveries`` is what the plan is compiled with; ``requests[k]`` the requests delivery ``k`` serves.
    With ``view`` (``"consistent"`` / ``"mirrored"``) and ``kinds`` (``devices.join_kinds``) it serves replicas.
    """

    def __init__(self, graph, view=None, kinds=None):
        self.job_name = graph.name
        self.multi_device = view is not None
        self.plan_deliveries, self.requests = _group(graph.watches, self.multi_device)
        self.view = view
        self.kinds = [kinds.get(d.tensor.id) for d in self.plan_deliveries] if self.multi_device else None
        self.pending = []           # this call's (request, host copy, step), handed over in one piece
        self.after_run = list(dict.fromkeys(r.after_run for rs in self.requests for r in rs if r.after_run))

    def _describe(self, request, step):
        return f"{request.describe} (call {step} of job {self.job_name})"

    def emit(self, k, copy, step):
        """Called by the plan as soon as watched tensor ``k`` is on its way to the host. A summary already on the
        host goes to its ``watch_summary`` handler right here; the rest waits for ``hand_over``."""
        for request in self.requests[k]:
            if request.inline and not callable(copy):
                try:
                    request.call(copy, step)
                except BaseException as e:  # reported as the dispatcher reports its callbacks' errors
                    dispatch.default().report(self._describe(request, step), e)
            else:
                self.pending.append((request, copy, step))

    def hand_over(self):
        """Give this call's deliveries to the dispatcher as one batch: one wake-up a call, however many watches.
        Requests' ``after_run`` hooks run first, here on the job's thread; what they return goes in a trailing
        batch (``runtime.dispatch``). The previous call's trailing batch, which ran beside this call's plan, is
        waited for here; returns its ticket (0: none) for the job to raise its errors once the call is done."""
        batch, self.pending = self.pending, []
        calls = [(lambda r=r, c=c, s=s: r.call(c() if callable(c) else c, s),
                  lambda r=r, s=s: self._describe(r, s)) for r, c, s in batch]
        trailing = [call for after_run in self.after_run for call in after_run()]
        dispatcher = dispatch.default()
        previous = dispatcher.take_trailing()
        if calls:
            dispatcher.submit_batch(calls)
        if trailing:
            dispatcher.submit_batch(trailing, trailing=True)
        if previous:
            dispatcher.wait(previous)
        return previous

    # ------------------------------------------------------------------------------------------ several devices
    def for_replica(self, graph):
        """The ``Delivery`` list of a replica's own graph (traced for its shapes): the same requests, same order."""
        return _group(graph.watches, True)[0]

    def replica_emitters(self, n):
        """``(emitters, pieces)``: replica ``r``'s plan emits with ``emitters[r]`` into ``pieces[k][r]``."""
        pieces = [[None] * n for _ in self.requests]

        def emitter(r):
            def emit(k, copy, step):
                pieces[k][r] = copy
            return emit
        return [emitter(r) for r in range(n)], pieces

    def join_replicas(self, pieces, step):
        """Queue the joined value of each delivery every replica emitted this call (``hand_over`` sends it)."""
        for k, (copies, kind) in enumerate(zip(pieces, self.kinds)):
            if any(c is None for c in copies):
                continue            # not this call (every=N), or a replica failed before delivering
            requests = [r for r in self.requests[k] if r.when is None or r.when()]
            if requests:
                joined = _LazyJoin(copies, kind, self.view)
                self.pending.extend((r, joined, step) for r in requests)


class _LazyJoin:
    """The joined value of one delivery, made on first use in the dispatcher thread (CuPy copies resolved there)."""

    def __init__(self, copies, kind, view):
        self._copies, self._kind, self._view, self._value = copies, kind, view, None

    def __call__(self):
        if self._value is None:
            self._value = devices.join([c() if callable(c) else c for c in self._copies], self._kind, self._view)
        return self._value
