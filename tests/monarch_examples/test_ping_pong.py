"""Monarch's ping-pong example (``docs/source/examples/ping_pong.py``): its steps with
this project's API, and what its actors print, checked where the client shows it
(``[MESH RANK] line``)."""

from __future__ import annotations

import pytest
from ping_pong_actors import ExampleActor, ToyActor

from monarch_kernel import this_host

pytestmark = pytest.mark.filterwarnings("ignore:per_host=.* asks for .* GPU procs:UserWarning")

NUM_ACTORS = 4
#: Generous for a busy machine; never a measure of speed.
WAIT = 60


def test_hello_world_reaches_every_actor_and_then_each_one_through_a_slice(printed):
    """Section "Hello World": ``call`` reaches the four ``ToyActor``s at once; then
    ``slice(gpus=idx)`` picks each one for a ``call_one``. Each prints its rank and
    the message it got."""
    with printed:
        local_proc_mesh = this_host().spawn_procs(per_host={"gpus": NUM_ACTORS})
        # This spawns 4 instances of 'ToyActor'
        toy_actor = local_proc_mesh.spawn("toy_actor", ToyActor)

        answers = toy_actor.hello_world.call("hey there, from script!!").get(timeout=WAIT)
        futures = []
        for idx in range(NUM_ACTORS):
            actor_instance = toy_actor.slice(gpus=idx)
            futures.append(actor_instance.hello_world.call_one(f"Here's an arbitrary unique value: {idx}"))
        for fut in futures:
            assert fut.get(timeout=WAIT) is None

        assert answers.values() == [None] * NUM_ACTORS
        name = local_proc_mesh.name
        expected = [f"[{name} {i}] Identity: {i}, msg='hey there, from script!!'" for i in range(NUM_ACTORS)]
        unique = [f"Here's an arbitrary unique value: {i}" for i in range(NUM_ACTORS)]
        expected += [f"[{name} {i}] Identity: {i}, msg={unique[i]!r}" for i in range(NUM_ACTORS)]
        text = printed.wait_for(lambda t: all(line in t.splitlines() for line in expected))
        assert all(line in text.splitlines() for line in expected), text


def test_actors_of_two_meshes_ping_their_peers_at_the_same_coordinates(printed):
    """Section "Ping Pong": ``ExampleActor``s on two meshes of two procs; each is
    given the other mesh and keeps the actor at its own coordinates; ``send("Ping")``
    from one mesh makes each of its actors call ``recv`` on its peer, then the other
    way round. Each receiver prints who sent what."""
    with printed:
        local_mesh_0 = this_host().spawn_procs(per_host={"gpus": 2})
        actor_0 = local_mesh_0.spawn(
            "actor_0",
            ExampleActor,
            "actor_0",  # this arg is passed to ExampleActor.__init__
        )
        local_mesh_1 = this_host().spawn_procs(per_host={"gpus": 2})
        actor_1 = local_mesh_1.spawn("actor_1", ExampleActor, "actor_1")

        # Initialize each actor with references to each other
        actor_0.init.call(actor_1).get(timeout=WAIT)
        actor_1.init.call(actor_0).get(timeout=WAIT)
        # Actor 0 sends to Actor 1, then Actor 1 to Actor 0
        actor_0.send.call("Ping").get(timeout=WAIT)
        actor_1.send.call("Ping").get(timeout=WAIT)

        expected = [
            f"[{local_mesh_1.name} {i}] Pong!, Receiver (actor_1:{i}) received msg Sender (actor_0:{i}) msg='Ping'"
            for i in range(2)
        ] + [
            f"[{local_mesh_0.name} {i}] Pong!, Receiver (actor_0:{i}) received msg Sender (actor_1:{i}) msg='Ping'"
            for i in range(2)
        ]
        text = printed.wait_for(lambda t: all(line in t.splitlines() for line in expected))
        assert all(line in text.splitlines() for line in expected), text
        assert text.count("Pong!") == 4, text  # each receiver once, no other
