"""The actors of Monarch's web-crawler example (``docs/source/examples/crawler.py``),
written for this project, in a module the workers import (a worker gets the
controller's ``sys.path``, where pytest put this folder).

One change: the site's address is a constructor argument of ``CrawlActor`` (the
example's module constant ``BASE``), since the test serves its own site on a free
port; and a link is absolute when it starts with a scheme (the example looks for
``https://``, the test site is plain http).
"""

from __future__ import annotations

from collections import deque
from typing import Any
from urllib.parse import urlparse, urlunparse

import requests
from bs4 import BeautifulSoup

from monarch_kernel import Actor, Port, context, endpoint

#: Seconds a crawler waits for an item before it decides the crawl is over (the
#: example's 5, doubled for a busy machine: a crawler that gives up while another
#: still parses a page leaves its port among the waiters, and what is sent there is lost).
TIMEOUT = 10


class QueueActor(Actor):
    """A deque of items and the ports of crawlers waiting for one: ``get`` on an
    empty queue keeps the port; ``insert`` wakes a waiter or queues the item."""

    def __init__(self) -> None:
        self.q: deque[tuple[str, int]] = deque()
        self.seen_links: set[str] = set()
        self.waiters: deque[Port[tuple[str, int] | None]] = deque()

    @endpoint
    def insert(self, item: str, depth: int) -> None:
        if item not in self.seen_links:
            self.seen_links.add(item)
            if self.waiters:
                port = self.waiters.popleft()
                port.send((item, depth))
            else:
                self.q.append((item, depth))

    @endpoint(explicit_response_port=True)
    def get(self, port: Port[tuple[str, int] | None]) -> None:
        if self.q:
            port.send(self.q.popleft())
        else:
            self.waiters.append(port)


class CrawlActor(Actor):
    """Takes items off the first queue of the mesh, fetches each page, and queues
    the links it finds on the site (one level less deep), until the queue stays
    empty for ``TIMEOUT`` s; returns how many pages it crawled."""

    def __init__(self, all_queues: Any, base: str) -> None:
        self.target_queue = all_queues.slice(procs=slice(0, 1))
        self.base = base
        self.processed = 0

    @staticmethod
    def normalize_url(url: str) -> str:
        p = urlparse(url)
        return urlunparse((p.scheme, p.netloc, p.path, p.params, "", ""))

    def _crawl_internal(self, target: str, depth: int) -> None:
        response = requests.get(target, timeout=60)
        response_size_kb = len(response.content) / 1024
        print(f"    - {target} was {response_size_kb:.2f} KB", flush=True)
        parsed = BeautifulSoup(response.content, "html.parser")

        anchors = parsed.find_all("a", href=True)
        for a in anchors:
            href = str(a["href"])
            link = href if href.startswith(("http://", "https://")) else self.base + href

            # Stop at the target depth and only follow links on our base site.
            if depth > 0 and self.base in link:
                normalized_link = CrawlActor.normalize_url(link)
                self.target_queue.insert.broadcast(normalized_link, depth - 1)

    @endpoint
    def crawl(self) -> int:
        rank = context().actor_instance.rank

        while True:
            try:
                result = self.target_queue.get.call_one().get(timeout=TIMEOUT)
            except TimeoutError:
                print("Queue has no items, returning done value.", flush=True)
                result = None
            if result is None:
                break
            url, depth = result
            print(f"Crawler #{rank} found {url} @ depth={depth}.", flush=True)
            self._crawl_internal(url, depth)
            self.processed += 1

        return self.processed
