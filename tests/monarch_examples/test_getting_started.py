"""Monarch's getting-started guide (``docs/source/examples/getting_started.py``), one
test per section: the guide's steps with this project's API, and the results the
guide prints, checked.

On a machine without GPUs, ``per_host={"gpus": N}`` runs the procs on the CPU, with a
warning.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import torch
from getting_started_actors import (
    Chatty,
    ContextAwareActor,
    Counter,
    DataLoader,
    DataTrainer,
    Errorful,
    InferenceEngine,
    Opener,
    Recorder,
    SupervisorActor,
    Trainer,
    Waiter,
)
from getting_started_tensors import LinearActor, ParameterServer, Worker, check_memory
from proc_helpers import Failures, wait_for

import monarch_kernel
from monarch_kernel import (
    ActorError,
    Channel,
    Future,
    HostMesh,
    ProcMesh,
    RemoteException,
    ValueMesh,
    fetch_shard,
    hosts_from_config,
    send,
    this_host,
    this_proc,
)

pytestmark = pytest.mark.filterwarnings("ignore:per_host=.* asks for .* GPU procs:UserWarning")

#: Generous for a busy machine; never a measure of speed.
WAIT = 60


# -- Defining an Actor; Spawning An Actor In The Local Process; Sending A Simple Message


def test_an_actor_spawned_on_this_proc_answers_call_one_with_a_future():
    """Sections "Defining an Actor" to "Sending A Simple Message": a ``Counter`` on
    ``this_proc()``, ``get_value.call_one()`` gives a Future whose ``get()`` is 0."""
    counter = this_proc().spawn("counter", Counter, initial_value=0)

    fut = counter.get_value.call_one()
    assert isinstance(fut, Future)
    value = fut.get(timeout=WAIT)

    assert value == 0
    counter.increment.call_one().get(timeout=WAIT)
    assert counter.get_value.call_one().get(timeout=WAIT) == 1


# -- Multiple Actors at Once: broadcasting, slicing, call --------------------------------


def test_broadcasts_to_a_mesh_and_to_a_slice_then_call_gathers_every_value():
    """Section "Multiple Actors at Once": counters on ``{"gpus": 8}``; ``broadcast``
    to all, then to gpus 0 to 3 (a slice); ``call()`` gives a ValueMesh in which the
    first four counted twice. Messages from one sender arrive in the order sent, so
    the call sees both broadcasts."""
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 8})
    counters = procs.spawn("counters", Counter, 0)

    counters.increment.broadcast()
    counters.slice(gpus=slice(0, 4)).increment.broadcast()
    values = counters.get_value.call().get(timeout=WAIT)

    assert isinstance(values, ValueMesh)
    assert [(p["gpus"], v) for p, v in values.items()] == [(i, 2 if i < 4 else 1) for i in range(8)]
    assert counters.slice(gpus=5).get_value.call_one().get(timeout=WAIT) == 1


# -- Multiple Hosts ------------------------------------------------------------------------


def test_hosts_from_config_without_a_job_is_this_host_and_trainers_step_on_it(tmp_path, monkeypatch):
    """Section "Multiple Hosts": ``hosts_from_config("MONARCH_HOSTS")`` (here, with no
    job configured in the working folder, this host: extent ``{}``), trainers on
    ``{"gpus": 4}`` of it, one ``step`` each, naming the point of the message."""
    monkeypatch.chdir(tmp_path)  # no .monarch/ job here
    hosts = hosts_from_config("MONARCH_HOSTS")
    assert isinstance(hosts, HostMesh)
    assert dict(hosts.extent) == {}

    trainer_procs = hosts.spawn_procs(per_host={"gpus": 4})
    assert dict(trainer_procs.extent) == {"gpus": 4}
    trainers = trainer_procs.spawn("trainer", Trainer)
    steps = trainers.step.call().get(timeout=WAIT)

    assert steps.values() == [f"Trainer {{'gpus': {i}/4}} taking a step." for i in range(4)]


# -- Logging -------------------------------------------------------------------------------


def _lines_for(text: str, words: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.endswith(words)]


def _count(line: str) -> int:
    """How many lines a shown line stands for (``[N similar log lines]``, else 1)."""
    m = re.search(r"\] \[(\d+) similar log lines\] ", line)
    return int(m.group(1)) if m else 1


def test_logging_option_merges_the_same_line_from_many_ranks(printed):
    """Section "Logging": ``asyncio.run(procs.logging_option(stream_to_client=True,
    aggregate_window_sec=3))``, then every rank of 8 prints the same line: it shows
    once per window, with the ranks and ``[N similar log lines]``; a line of one rank
    shows with its rank."""
    with printed:
        procs = this_host().spawn_procs(per_host={"gpus": 8})
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=3))

        procs.spawn("chatty", Chatty).log_step.call(1).get(timeout=WAIT)
        text = printed.wait_for(
            lambda t: (
                sum(map(_count, _lines_for(t, "finished step 1"))) >= 8
                and bool(_lines_for(t, "rank zero saves a checkpoint"))
            )
        )

        merged = _lines_for(text, "finished step 1")
        assert sum(map(_count, merged)) == 8, text
        assert all(ln.startswith(f"[{procs.name} ") for ln in merged), text
        # Lines within one window are merged (on a busy machine the eight may span two).
        assert any("similar log lines]" in ln for ln in merged), text
        if len(merged) == 1:
            assert merged[0] == f"[{procs.name} ranks 0-7] [8 similar log lines] finished step 1", text
        assert _lines_for(text, "rank zero saves a checkpoint") == [
            f"[{procs.name} 0] rank zero saves a checkpoint"
        ], text


# -- Actor and Process References ------------------------------------------------------------


def test_actors_passed_to_actors_pair_each_trainer_with_its_own_data_loader():
    """Section "Actor and Process References": data loaders and trainers on the same
    procs; each trainer keeps the loader at its own coordinates (``slice(**rank)``),
    so each step takes the next example of its own loader."""
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 4})
    dataloaders = trainer_procs.spawn("dataloader", DataLoader)
    dtrainers = trainer_procs.spawn("dtrainers", DataTrainer, dataloaders)

    first = dtrainers.step.call().get(timeout=WAIT)
    second = dtrainers.step.call().get(timeout=WAIT)

    assert first.values() == ["Step with data <fake data 1> and input = None"] * 4
    assert second.values() == ["Step with data <fake data 2> and input = None"] * 4
    assert dataloaders.slice(gpus=3).example.call_one().get(timeout=WAIT) == "<fake data 3>"


# -- The Supervision Tree --------------------------------------------------------------------


def test_an_endpoint_that_raises_fails_the_future_of_its_caller():
    """Section "The Supervision Tree": ``say_hello`` raises; the caller's ``get()``
    raises it ("It didn't say hello"), with the remote exception's message."""
    e = this_proc().spawn("errorful", Errorful)
    with pytest.raises(Exception) as raised:
        e.say_hello.call_one().get(timeout=WAIT)

    assert isinstance(raised.value, ActorError)
    assert "I don't want to" in str(raised.value)
    assert isinstance(raised.value.exception, Exception)
    assert str(raised.value.exception) == "I don't want to"


def test_a_broadcast_that_raises_reaches_the_unhandled_fault_hook(monkeypatch):
    """Sections "Broadcasting Without Response" and the end of "Fine-grained
    Supervision": ``say_hello.broadcast()`` gives the caller nothing to raise; each
    rank's failure goes up the tree and, handled by nobody, reaches
    ``unhandled_fault_hook`` (here ``monarch_kernel.unhandled_fault_hook``) as a
    ``MeshFailure``. (The guide broadcasts to an actor on ``this_proc()`` under ``if
    False``; here the actors are on a mesh of two procs.)"""
    hook = Failures()  # returns None: the failure is handled
    monkeypatch.setattr(monarch_kernel, "unhandled_fault_hook", hook)
    procs = this_host().spawn_procs(per_host={"procs": 2})
    e = procs.spawn("errorful", Errorful)

    e.say_hello.broadcast()  # do not expect a response

    assert hook.wait(lambda got: len(got) >= 2, within=WAIT), hook.got
    assert hook.kinds() == ["actor_failed", "actor_failed"]
    assert sorted(f.rank for f in hook.got) == [0, 1]
    assert all("I don't want to" in f.message for f in hook.got), hook.got


def test_a_broadcast_that_raises_on_this_proc_reaches_the_unhandled_fault_hook(monkeypatch):
    """Section "Broadcasting Without Response", as the guide writes it (under ``if
    False`` there): ``e`` on ``this_proc()``; the error "will be delivered to the
    owner of e", the client, where nobody handles it: ``unhandled_fault_hook``."""
    hook = Failures()
    monkeypatch.setattr(monarch_kernel, "unhandled_fault_hook", hook)
    e = this_proc().spawn("errorful", Errorful)

    e.say_hello.broadcast()  # do not expect a response

    assert hook.wait(lambda got: len(got) >= 1, within=10), "unhandled_fault_hook got nothing"
    assert hook.kinds() == ["actor_failed"]
    assert "I don't want to" in hook.got[0].message


def test_supervise_handles_the_failures_of_the_mesh_an_actor_owns(monkeypatch):
    """Section "Fine-grained Supervision": an actor that spawned a mesh owns it; a
    failure there goes to its ``__supervise__``, which returns True (handled), so it
    goes no further: ``unhandled_fault_hook`` never hears of it."""
    hook = Failures()
    monkeypatch.setattr(monarch_kernel, "unhandled_fault_hook", hook)
    supervisor = this_host().spawn_procs(per_host={"procs": 1}).spawn("supervisor", SupervisorActor)

    def received() -> list[str]:
        return supervisor.failures_received.call_one().get(timeout=WAIT)

    supervisor.make_them_fail.call_one().get(timeout=WAIT)
    wait_for(lambda: len(received()) >= 2, within=WAIT, every=0.2)

    failures = received()
    assert len(failures) == 2, failures
    assert all("I don't want to" in f for f in failures), failures
    assert hook.got == []


# -- Point-to-Point RDMA ---------------------------------------------------------------------


@pytest.mark.slow  # the workers import torch
def test_a_worker_reads_the_parameter_servers_weights_through_an_rdma_buffer():
    """Section "Point-to-Point RDMA": a parameter server on one proc mesh hands out
    an ``RDMABuffer`` of its 1000x1000 weights (a small message); a worker on another
    mesh ``read_into``s its own tensor, and then holds the same weights."""
    server_proc = this_host().spawn_procs(per_host={"gpus": 1})
    worker_proc = this_host().spawn_procs(per_host={"gpus": 1})
    server = server_proc.spawn("server", ParameterServer)
    worker = worker_proc.spawn("worker", Worker)

    worker.sync_weights.call_one(server).get(timeout=WAIT)

    weights = server.weights_here.call_one().get(timeout=WAIT)
    copied = worker.weights_here.call_one().get(timeout=WAIT)
    assert copied.shape == (1000, 1000)
    assert torch.equal(copied, weights)
    assert bool(weights.ne(0).any())  # random weights, not the worker's zeros


# -- Distributed Tensors ---------------------------------------------------------------------


def _trainer_procs(tmp_path, monkeypatch) -> ProcMesh:
    """The guide's ``trainer_procs``: ``{"gpus": 4}`` on the hosts of the config (this
    host here: no "hosts" dimension, so shards are named by ``gpus`` alone)."""
    monkeypatch.chdir(tmp_path)
    return hosts_from_config("MONARCH_HOSTS").spawn_procs(per_host={"gpus": 4})


@pytest.mark.slow  # the workers import torch
def test_distributed_tensors_live_one_per_proc_and_compute_there(tmp_path, monkeypatch):
    """Section "Distributed Tensors": under ``trainer_procs.activate()``,
    ``torch.rand(3, 4)`` is a tensor per proc (each its own values); ``fetch_shard``
    brings one proc's; ``t @ t.T`` runs on every proc."""
    trainer_procs = _trainer_procs(tmp_path, monkeypatch)
    with trainer_procs.activate():
        t = torch.rand(3, 4)

    one = fetch_shard(t, gpus=0).get(timeout=WAIT)
    two = fetch_shard(t, gpus=1).get(timeout=WAIT)
    assert one.shape == two.shape == (3, 4)
    assert not torch.equal(one, two)

    with trainer_procs.activate():
        dist_compute = t @ t.T
    assert torch.allclose(fetch_shard(dist_compute, gpus=0).get(timeout=WAIT), one @ one.T)
    assert torch.allclose(fetch_shard(dist_compute, gpus=1).get(timeout=WAIT), two @ two.T)


@pytest.mark.slow  # the workers import torch
def test_actors_given_a_distributed_tensor_each_get_the_shard_of_their_proc(tmp_path, monkeypatch):
    """Section "Distributed Tensors": ``dtrainers.step.call(dist_compute[0])``: each
    trainer gets the shard of the proc it lives on."""
    trainer_procs = _trainer_procs(tmp_path, monkeypatch)
    dataloaders = trainer_procs.spawn("dataloader", DataLoader)
    dtrainers = trainer_procs.spawn("dtrainers", DataTrainer, dataloaders)
    with trainer_procs.activate():
        t = torch.rand(3, 4)
        dist_compute = t @ t.T

    steps = dtrainers.step.call(dist_compute[0]).get(timeout=WAIT)

    for gpu, text in enumerate(steps.values()):
        row = fetch_shard(dist_compute[0], gpus=gpu).get(timeout=WAIT)
        assert text == f"Step with data <fake data 1> and input = {row}"


@pytest.mark.slow  # the workers import torch
def test_rref_makes_an_endpoints_output_a_distributed_tensor(tmp_path, monkeypatch):
    """Section "Distributed Tensors": ``torch.relu(linear.forward.rref(t))``, the
    endpoint's output on each proc as a distributed tensor, used in further
    computation; its ``propagate`` gives the result's shape without waiting. (The
    guide's ``t`` is 3 x 4 against 3 x 3 weights: the result is poisoned, which the
    guide never looks at; the values are checked with a 3 x 3 input.)"""
    trainer_procs = _trainer_procs(tmp_path, monkeypatch)
    with trainer_procs.activate():
        t = torch.rand(3, 4)
    linear = trainer_procs.spawn("linear", LinearActor)

    with trainer_procs.activate():
        o = torch.relu(linear.forward.rref(t))

    assert tuple(o.shape) == (3, 4)  # as propagate says; the procs' matmul failed
    with pytest.raises(RemoteException, match="cannot be multiplied"):
        fetch_shard(o, gpus=0).get(timeout=WAIT)
    with trainer_procs.activate():
        square = torch.rand(3, 3)
        good = torch.relu(linear.forward.rref(square))
    for gpu in range(4):
        weights = linear.slice(gpus=gpu).weights.call_one().get(timeout=WAIT)
        x = fetch_shard(square, gpus=gpu).get(timeout=WAIT)
        assert torch.allclose(fetch_shard(good, gpus=gpu).get(timeout=WAIT), torch.relu(x @ weights))


# -- Actor Context -----------------------------------------------------------------------------


def test_context_gives_the_actors_rank_and_the_rank_within_the_message():
    """Section "Actor Context": ``context().actor_instance.rank`` is the actor's point
    in its mesh; ``context().message_rank`` the point within the message, which
    differs when the message went to a slice."""
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 4})
    c = trainer_procs.spawn("context_actor", ContextAwareActor)

    whole = c.get_context_info.call().get(timeout=WAIT)
    sliced = c.slice(gpus=slice(2, 4)).get_context_info.call().get(timeout=WAIT)

    assert whole.values() == [
        f"Actor rank: {{'gpus': {i}/4}}, message rank: {{'gpus': {i}/4}}" for i in range(4)
    ]
    assert sliced.values() == [
        f"Actor rank: {{'gpus': {i + 2}/4}}, message rank: {{'gpus': {i}/2}}" for i in range(2)
    ]


# -- Free Remote Functions ---------------------------------------------------------------------


def test_a_remote_function_runs_on_every_proc_of_the_active_mesh():
    """Section "Free Remote Functions": ``check_memory.call()`` under
    ``trainer_procs.activate()`` gives each proc's memory info."""
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 4})
    with trainer_procs.activate():
        infos = check_memory.call().get(timeout=WAIT)

    assert len(infos.values()) == 4
    assert all(info.rss > 0 for info in infos.values())


# -- Channels and Low-level messaging ----------------------------------------------------------


def test_a_channel_carries_what_its_port_is_sent_to_its_receiver():
    """Section "Channels and Low-level messaging": ``Channel.open()`` gives a port and
    a receiver; what the port is sent, the receiver gets."""
    port, recv = Channel.open()

    port.send(3)

    assert recv.recv().get(timeout=WAIT) == 3


def test_send_delivers_the_answer_of_every_actor_to_a_port():
    """Section "Channels and Low-level messaging": ``send(endpoint, args, kwargs,
    port=port)`` sends each actor's response to the port: four procs, four answers
    (an endpoint here; the guide's remote function: the next test)."""
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = trainer_procs.spawn("counters", Counter, 7)
    port, recv = Channel.open()

    send(counters.get_value, args=(), kwargs={}, port=port)

    assert [recv.recv().get(timeout=WAIT) for _ in range(4)] == [7, 7, 7, 7]


def test_send_delivers_what_a_remote_function_returns_on_every_proc_to_a_port():
    """Section "Channels and Low-level messaging", as the guide writes it:
    ``send(check_memory, args=(), kwargs={}, port=port)`` under ``activate()``."""
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 4})
    port, recv = Channel.open()

    with trainer_procs.activate():
        send(check_memory, args=(), kwargs={}, port=port)

    assert all(recv.recv().get(timeout=WAIT).rss > 0 for _ in range(4))


# -- Message Ordering ----------------------------------------------------------------------


def test_messages_from_one_sender_arrive_in_order_and_one_at_a_time():
    """Section "Message Ordering": messages from one sender are delivered in the order
    sent; a send to a mesh (or a slice) behaves as a send to each actor; each actor
    handles one message at a time."""
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    recorders = procs.spawn("recorders", Recorder)

    for i in range(40):
        target = recorders if i % 2 == 0 else recorders.slice(gpus=slice(0, 2))
        target.record.broadcast(i)
    histories = recorders.history.call().get(timeout=WAIT).values()

    evens = list(range(0, 40, 2))
    assert histories == [
        (list(range(40)), False),
        (list(range(40)), False),
        (evens, False),
        (evens, False),
    ]


def test_different_actors_in_one_process_handle_messages_concurrently():
    """Section "Message Ordering": different actors in the same process handle
    messages concurrently: one waits for a gate that another, on the same proc,
    opens (one at a time, this would never return)."""
    procs = this_host().spawn_procs(per_host={"procs": 1})
    waiter = procs.spawn("waiter", Waiter)
    opener = procs.spawn("opener", Opener)

    waiting = waiter.wait_for_gate.call_one()
    opener.open_gate.call_one().get(timeout=WAIT)

    assert waiting.get(timeout=WAIT) is True


# -- Responding Out of Order -------------------------------------------------------------------


def test_an_explicit_response_port_lets_a_later_message_be_handled_first():
    """Section "Responding Out of Order": ``infer`` takes an explicit response port
    and returns at once, so ``update_weights(1)``, sent after two ``infer`` calls, is
    handled before they are answered: the second answer uses the newest weights."""
    engine = this_proc().spawn("engine", InferenceEngine)

    engine.update_weights.broadcast(0)
    first = engine.infer.call_one()
    second = engine.infer.call_one()
    engine.update_weights.broadcast(1)

    assert first.get(timeout=WAIT) in ("inferred with: 0", "inferred with: 1")
    assert second.get(timeout=WAIT) == "inferred with: 1"  # still uses newest weights
