"""The actors of Monarch's getting-started guide (``docs/source/examples/getting_started.py``)
that need no torch, written for this project, in a module of their own so that the
workers import them (a worker gets the controller's ``sys.path``, where pytest put
this folder); those that use torch are in ``getting_started_tensors.py``, so that the
other workers do not import it.

The classes keep the guide's names and endpoints; where a test needs to look at a
result the guide only prints, an endpoint is added, and its docstring says so.
"""

from __future__ import annotations

import threading
import time
from queue import Queue
from typing import Any

from monarch_kernel import Actor, MeshFailure, Port, context, endpoint, this_host

# -- Defining an Actor ----------------------------------------------------------------


class Counter(Actor):
    def __init__(self, initial_value: int) -> None:
        self.value = initial_value

    @endpoint
    def increment(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value


# -- Multiple Hosts -------------------------------------------------------------------


class Trainer(Actor):
    @endpoint
    def step(self) -> str:
        my_point = context().message_rank
        return f"Trainer {my_point} taking a step."


# -- Logging --------------------------------------------------------------------------


class Chatty(Actor):
    """Not in the guide: what its logging section is about, a line that every rank
    writes, and one that only one rank writes."""

    @endpoint
    def log_step(self, step: int) -> None:
        print(f"finished step {step}", flush=True)
        if context().actor_instance.rank.rank == 0:
            print("rank zero saves a checkpoint", flush=True)


# -- Actor and Process References -----------------------------------------------------


class DataLoader(Actor):
    def __init__(self) -> None:
        self.i = 0

    @endpoint
    def example(self) -> str:
        self.i += 1
        return f"<fake data {self.i}>"


class DataTrainer(Actor):
    """The guide's second ``Trainer``: given the data loaders, it keeps the one at
    its own coordinates."""

    def __init__(self, dataloader: Any) -> None:
        my_rank = context().actor_instance.rank
        # select or single corresponding data loader to work with.
        self.dataloader = dataloader.slice(**my_rank)

    @endpoint
    def step(self, input: Any = None) -> str:
        data = self.dataloader.example.call_one().get()
        return f"Step with data {data} and input = {input}"


# -- The Supervision Tree -------------------------------------------------------------


class Errorful(Actor):
    @endpoint
    def say_hello(self) -> None:
        raise Exception("I don't want to")


class SupervisorActor(Actor):
    """The guide's ``SupervisorActor``, given a mesh of its own to supervise (the guide
    shows only ``__supervise__``): it spawns two procs with an ``Errorful`` each, so
    those belong to it, and keeps what ``__supervise__`` hears."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.procs = this_host().spawn_procs(per_host={"procs": 2})
        self.errorful = self.procs.spawn("errorful", Errorful)

    def __supervise__(self, failure: MeshFailure) -> bool:
        # The failure message will include the id of the actor that failed and
        # the reason why.
        print(f"Failure received: {failure}")
        self.received.append(str(failure))
        # A truthy value: handled, not propagated to the creator of this actor.
        return True

    @endpoint
    def make_them_fail(self) -> None:
        """Not in the guide: a broadcast nobody waits for, which raises on each rank."""
        self.errorful.say_hello.broadcast()

    @endpoint
    def failures_received(self) -> list[str]:
        """Not in the guide: what ``__supervise__`` was given so far."""
        return list(self.received)


# -- Actor Context --------------------------------------------------------------------


class ContextAwareActor(Actor):
    @endpoint
    def get_context_info(self) -> str:
        actor_instance = context().actor_instance
        # The coordinates in the message: not always the actor's rank, because
        # messages can be sent to a slice of actors rather than the whole thing.
        message_rank = context().message_rank
        return f"Actor rank: {actor_instance.rank}, message rank: {message_rank}"


# -- Message Ordering -----------------------------------------------------------------


class Recorder(Actor):
    """Not in the guide, whose ordering section has no code: keeps the messages it
    handles, in the order it handles them, and says whether two ever overlapped."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.busy = False
        self.overlapped = False

    @endpoint
    def record(self, i: int) -> None:
        if self.busy:
            self.overlapped = True
        self.busy = True
        time.sleep(0.001)  # room for another message to come in, if one could
        self.seen.append(i)
        self.busy = False

    @endpoint
    def history(self) -> tuple[list[int], bool]:
        return self.seen, self.overlapped


#: Shared by the actors of one process: a ``Waiter`` waits for it, an ``Opener`` opens it.
_gate = threading.Event()


class Waiter(Actor):
    """Not in the guide: waits (up to a minute) for another actor of its process."""

    @endpoint
    def wait_for_gate(self) -> bool:
        return _gate.wait(timeout=60)


class Opener(Actor):
    """Not in the guide: lets the ``Waiter`` of its process go on."""

    @endpoint
    def open_gate(self) -> None:
        _gate.set()


# -- Responding Out of Order ----------------------------------------------------------


class InferenceEngine(Actor):
    def __init__(self) -> None:
        self.q: Queue[Port[str]] = Queue()
        self.new_weights: Any = None
        # (a daemon thread, unlike the guide's: this engine lives in the test process,
        # whose exit must not wait on its endless loop)
        self.worker = threading.Thread(target=self.run, daemon=True)
        self.worker.start()

    @endpoint
    def update_weights(self, new_weights: Any) -> None:
        self.new_weights = new_weights

    @endpoint(explicit_response_port=True)
    def infer(self, port: Port[str]) -> None:
        self.q.put(port)

    def run(self) -> None:
        while True:
            request = self.q.get()
            # always use the most recent weight version we have:
            result = f"inferred with: {self.new_weights}"
            # pretend to take time
            time.sleep(1)
            # process request, send response
            request.send(result)
