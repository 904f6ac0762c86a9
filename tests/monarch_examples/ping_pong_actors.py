"""The actors of Monarch's ping-pong example (``docs/source/examples/ping_pong.py``),
written for this project, in a module the workers import (a worker gets the
controller's ``sys.path``, where pytest put this folder)."""

from __future__ import annotations

from typing import Any

from monarch_kernel import Actor, current_rank, endpoint


class ToyActor(Actor):
    def __init__(self) -> None:
        self.rank = current_rank().rank

    @endpoint
    def hello_world(self, msg: str) -> None:
        print(f"Identity: {self.rank}, {msg=}", flush=True)


class ExampleActor(Actor):
    def __init__(self, actor_name: str) -> None:
        self.actor_name = actor_name

    @endpoint
    def init(self, other_actor: Any) -> None:
        self.other_actor = other_actor
        self.other_actor_pair = other_actor.slice(**current_rank())
        self.identity = current_rank().rank

    @endpoint
    def send(self, msg: str) -> None:
        self.other_actor_pair.recv.call(f"Sender ({self.actor_name}:{self.identity}) {msg=}").get()

    @endpoint
    def recv(self, msg: str) -> None:
        print(f"Pong!, Receiver ({self.actor_name}:{self.identity}) received msg {msg}", flush=True)
