"""The worker side of a KV connector, stood in: every transfer the scheduler
asks for completes within the step that asked for it.

A deployment with ``--kv-offloading-size`` (vLLM 0.33.0
``VllmConfig._post_init_kv_transfer_config``: the ``native`` backend is
``OffloadingConnector``, or ``SimpleCPUOffloadConnector`` with
``VLLM_USE_SIMPLE_KV_OFFLOAD=1``) builds the connector's *scheduler* side in
vLLM's own ``Scheduler.__init__`` (``KVConnectorFactory.create_connector``,
role ``SCHEDULER``), which decides what to store to CPU, what a lookup finds
there and what to load. The *worker* side copies GPU blocks to and from CPU
memory on CUDA streams; kvspec has no GPU and no KV tensors, so it stands
that side in, as the step loop stands in the forward pass:

* after each step, every load and store job the step's connector metadata
  names is reported complete (``OffloadingWorkerMetadata.completed_jobs``,
  one count per worker: ``num_workers`` of the connector's config), and the
  request of every asynchronous load is in ``finished_recving``, as
  ``OffloadingConnectorWorker.get_finished`` reports them once its transfers
  finish (``offloading/worker.py``). A real worker finishes a store a step or
  more later; a serial trace sends each request after the last one finished
  and the engine keeps stepping while ``has_pending_push_work()``
  (``EngineCore``), so by the next request every store is complete either
  way: :func:`drain` takes those steps.
* a connector kvspec has no stand-in for is ``Unsupported`` (one line naming
  it), never a guess.

It observes nothing and judges nothing: what the lookup offers, what it
loads and where the request resumes are the scheduler side's answers.
"""

from __future__ import annotations

from typing import Any

from ground.errors import Unsupported

#: Steps :func:`drain` takes at most after a request finished (each completes
#: every job the step issued; one is enough for the stand-in worker).
MAX_DRAIN_STEPS = 8


def connector_name(scheduler) -> str | None:
    """The scheduler's KV connector class name, or None without one."""
    connector = getattr(scheduler, "connector", None)
    return None if connector is None else type(connector).__name__


def _scheduler_side(connector) -> Any:
    """``OffloadingConnector`` keeps its scheduler side in
    ``connector_scheduler``; the others are their own."""
    return getattr(connector, "connector_scheduler", None) or connector


def check_supported(scheduler) -> None:
    """Refuse a connector whose worker side kvspec does not stand in."""
    name = connector_name(scheduler)
    if name is not None and name not in STOOD_IN:
        raise Unsupported(
            f"deployment: KV connector {name}: kvspec stands in the worker side of {', '.join(sorted(STOOD_IN))} only"
        )


def _num_workers(connector) -> int:
    side = _scheduler_side(connector)
    config = getattr(side, "config", None)
    return int(getattr(config, "num_workers", 1) or 1)


def _offloading_output(connector, metadata) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
    from vllm.v1.outputs import KVConnectorOutput

    jobs = {**(metadata.load_jobs or {}), **(metadata.store_jobs or {})}
    if not jobs:
        return None
    count = _num_workers(connector)
    recving = {job.req_id for job in (metadata.load_jobs or {}).values() if not getattr(job, "sync", False)}
    return KVConnectorOutput(
        finished_recving=recving or None,
        kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs={jid: count for jid in jobs}),
    )


#: Connector class -> the stand-in worker's output for one step's metadata.
STOOD_IN = {"OffloadingConnector": _offloading_output}


def worker_output(scheduler, scheduler_output) -> Any:
    """The ``KVConnectorOutput`` the workers would report after this step
    (None without a connector or with nothing to report)."""
    connector = getattr(scheduler, "connector", None)
    if connector is None:
        return None
    metadata = getattr(scheduler_output, "kv_connector_metadata", None)
    if metadata is None:
        return None
    return STOOD_IN[type(connector).__name__](connector, metadata)


def pending(scheduler) -> bool:
    """Whether the engine keeps stepping with nothing to schedule
    (``has_pending_push_work``, asked by ``EngineCore`` before ``schedule``)."""
    connector = getattr(scheduler, "connector", None)
    ask = getattr(connector, "has_pending_push_work", None)
    return bool(ask()) if ask is not None else False
