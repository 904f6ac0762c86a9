"""The mesh inspector: a live widget (anywidget, so no front-end build or extension
is needed) showing each proc's state, pid, CPU, memory, GPU (where NVIDIA GPUs
exist), distributed-tensor memory (once the mesh was activated), calls in flight and
last error; clicking a proc shows its recent log lines
and current stacks. From 33 procs on, a grid by host replaces the table: a cell per
proc coloured by state and shaded by load, its details in its tooltip and on click.

INSPECT-1: a background thread refreshes the state once a second, whether a cell
runs or not, until the widget is closed or the mesh is stopped.
VIEW-1: it shows what the Meshes panel shows, read the same way
(``controller.view_of``); only its controller's own knowledge (calls in flight, the
last error) is added.
INSPECT-2: CPU, memory and GPU use are measured by each worker on its own host (the
built-in actor's ``usage``), so a mesh across hosts shows every host's, grouped by
host; nothing is read from this host's process table for a pid of another host.
"""

from __future__ import annotations

import threading
from typing import Any

import anywidget
import traitlets

from monarch_kernel import controller

_ESM = """
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "monarch-inspector";
  el.appendChild(root);
  const colors = {alive: "#2a7", starting: "#58c", unresponsive: "#c80", dead: "#c33",
                  lost: "#c33", stopped: "#888", degraded: "#c80"};
  const GRID_FROM = 33;  // as the Meshes panel: a grid by host from this many procs
  function grid(procs, gpu) {  // a cell per proc, by host: state in colour, load in shade
    const hosts = new Map();
    for (const p of procs) {
      if (!hosts.has(p.host || "")) hosts.set(p.host || "", []);
      hosts.get(p.host || "").push(p);
    }
    const selected = model.get("selected");
    // hosts side by side as the output's width allows (64 hosts: a dozen rows, not 64)
    let html = `<div class="monarch-hosts" style="display:flex;flex-wrap:wrap;gap:2px 18px">`;
    for (const [host, ps] of hosts) {
      const alive = ps.filter(p => p.state === "alive").length;
      const cpus = ps.filter(p => typeof p.cpu === "number");
      const cpu = cpus.length ? Math.round(cpus.reduce((n, p) => n + p.cpu, 0) / cpus.length) : null;
      html += `<div class="monarch-host" data-host="${host}" style="min-width:200px"><b>host ${host}</b> ` +
        `<span class="monarch-host-summary" style="opacity:0.7">${alive}/${ps.length} alive` +
        (cpu === null ? "" : ` · CPU ${cpu}%`) + "</span>" +
        `<div style="display:flex;flex-wrap:wrap;gap:1px;padding:1px 0">`;
      for (const p of ps) {
        const pct = gpu && typeof p.gpu === "number" ? p.gpu : (p.cpu || 0);
        const shade = p.state === "alive" ? 0.45 + 0.55 * Math.max(0, Math.min(1, pct / 100)) : 1;
        const title = [`rank ${p.rank}`, p.state, p.pid ? `pid ${p.pid}` : "",
                       typeof p.cpu === "number" ? `CPU ${p.cpu}%` : "", p.rss || "",
                       p.inflight ? `${p.inflight} in flight` : "", p.error || ""].filter(Boolean).join(" · ");
        html += `<span class="monarch-proc monarch-cell" data-rank="${p.rank}" data-state="${p.state}" ` +
          `title="${title.replace(/"/g, "&quot;")}" style="width:9px;height:9px;cursor:pointer;` +
          `background:${colors[p.state] || "#888"};opacity:${shade.toFixed(2)}` +
          (p.rank === selected ? ";outline:2px solid #36c" : "") + `"></span>`;
      }
      html += "</div></div>";
    }
    return html + "</div>";
  }
  function draw() {
    const procs = model.get("procs");
    const gpu = model.get("gpu");
    const tensors = model.get("tensors");
    let html = `<div><b>mesh ${model.get("mesh")}</b> <span class="monarch-state">${model.get("state")}</span></div>`;
    if (procs.length >= GRID_FROM) {
      html += grid(procs, gpu);
    } else {
    html += "<table><tr><th>rank</th><th>state</th><th>pid</th><th>CPU %</th><th>memory</th>";
    if (gpu) html += "<th>GPU %</th><th>GPU memory</th>";
    if (tensors) html += "<th>tensors</th>";
    html += "<th>in flight</th><th>last error</th></tr>";
    const columns = 7 + (gpu ? 2 : 0) + (tensors ? 1 : 0);
    let host = null;
    for (const p of procs) {
      if (p.host && p.host !== host) {  // the grid: the procs of each host under its name
        host = p.host;
        html += `<tr class="monarch-host"><td colspan="${columns}"><b>host ${host}</b></td></tr>`;
      }
      html += `<tr class="monarch-proc" data-rank="${p.rank}" style="cursor:pointer">` +
        `<td>${p.rank}</td><td class="monarch-proc-state" style="color:${colors[p.state] || "#000"}">${p.state}</td>` +
        `<td>${p.pid || ""}</td><td>${p.cpu ?? ""}</td><td>${p.rss ?? ""}</td>` +
        (gpu ? `<td>${p.gpu ?? ""}</td><td>${p.gpu_mem ?? ""}</td>` : "") +
        (tensors ? `<td>${p.tensors ?? ""}</td>` : "") +
        `<td>${p.inflight ?? ""}</td><td>${p.error || ""}</td></tr>`;
    }
    html += "</table>";
    }
    const detail = model.get("detail");
    if (detail) html += `<pre class="monarch-detail" style="max-height:20em;overflow:auto">${detail}</pre>`;
    root.innerHTML = html;
    for (const row of root.querySelectorAll(".monarch-proc")) {
      row.onclick = () => { model.set("selected", Number(row.dataset.rank)); model.save_changes(); };
    }
  }
  model.on("change:procs", draw);
  model.on("change:detail", draw);
  model.on("change:state", draw);
  model.on("change:selected", draw);
  draw();
}
export default { render };
"""


def _size(n: int) -> str:
    """Bytes for a person: ``512 B``, ``3.0 KiB``, ``64.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class MeshInspector(anywidget.AnyWidget):  # type: ignore[misc]
    """The live picture of one mesh (see the module docstring)."""

    _esm = _ESM
    mesh = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("").tag(sync=True)
    procs: traitlets.List[Any] = traitlets.List([]).tag(sync=True)
    gpu = traitlets.Bool(False).tag(sync=True)
    #: A column of each proc's distributed-tensor memory, once its mesh was activated.
    tensors = traitlets.Bool(False).tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    detail = traitlets.Unicode("").tag(sync=True)

    def __init__(self, procs: Any, every: float = 1.0) -> None:
        super().__init__(mesh=procs.name)
        self._procs = procs
        self._every = every
        self._closed = threading.Event()
        self.refresh()
        self.observe(self._on_select, names="selected")
        threading.Thread(target=self._loop, name=f"monarch-inspector-{procs.name}", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        super().close()

    def __repr__(self) -> str:  # the text/plain beside the widget (nbconvert, terminals)
        counts: dict[str, int] = {}
        for p in self.procs:
            counts[p.get("state", "?")] = counts.get(p.get("state", "?"), 0) + 1
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        return f"MeshInspector(mesh {self.mesh!r}: {self.state}; {summary})"

    def _loop(self) -> None:  # INSPECT-1
        while not self._closed.wait(self._every):
            try:
                self.refresh()
            except Exception:
                pass  # a refresh that fails now may work in a second
            if self.state in ("stopped", "lost"):
                return

    def refresh(self) -> None:
        """Reads the mesh's state now (also what the background thread does): the
        Meshes panel's picture of it (VIEW-1), with what only its controller knows
        (calls in flight, the last error) beside."""
        view = controller.view_of(self.mesh)
        session = controller.session(self.mesh)
        errors = self._procs.death_lines() if session is not None else {}
        alive = [p["rank"] for p in view["ranks"] if p["state"] == "alive"] if view is not None else []
        inflight = session.calls_in_flight(alive) if session is not None else {}
        rows = []
        for p in view["ranks"] if view is not None else []:
            row: dict[str, Any] = {"rank": p["rank"], "state": p["state"], "pid": p["pid"], "host": p["host"]}
            u = p["usage"]
            if u:
                row["cpu"], row["rss"] = u["cpu"], f"{u['rss'] / 2**20:,.0f} MiB"
                if "gpu" in u:
                    row["gpu"], row["gpu_mem"] = u["gpu"], f"{u['gpu_mem'] / 2**20:,.0f} MiB"
                if "tensors" in u:
                    row["tensors"] = f"{_size(u['tensors'])} in {u['tensor_refs']}"
            if p["rank"] in inflight:
                row["inflight"] = inflight[p["rank"]]
            error = errors.get(p["rank"]) or (p["why"] if p["state"] != "alive" else "")
            if error:
                row["error"] = _escape(error[:200])
            rows.append(row)
        self.gpu = any("gpu" in r for r in rows)
        self.tensors = any("tensors" in r for r in rows)
        self.state = "stopped" if view is None else view["state"]
        self.procs = rows

    def _on_select(self, change: dict[str, Any]) -> None:
        rank = change["new"]
        if rank < 0:
            return

        def fetch() -> None:  # off the comm handler: stacks may take a moment
            try:
                session = controller.session(self.mesh)
                if session is None:
                    raise RuntimeError(f"this kernel does not control mesh {self.mesh!r} now")
                logs = "\n".join(session.logs(rank, 20))
                (stack,) = session.stacks([rank], timeout=5.0)
                self.detail = _escape(f"rank {rank}, last output:\n{logs}\n\nstacks:\n{stack}")
            except Exception as e:
                self.detail = _escape(f"rank {rank}: {e}")

        threading.Thread(target=fetch, daemon=True).start()


__all__ = ["MeshInspector"]
