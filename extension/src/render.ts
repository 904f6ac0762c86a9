/**
 * What the Meshes panel shows, as text and HTML, from the server extension's JSON
 * (GET /monarch/meshes, the /monarch/events stream). Its shape is
 * schema/mesh-view.schema.json, the one schema of it that the Python tests (real
 * views) and the jest tests (the fixtures) validate against. Pure functions of their
 * arguments, with no JupyterLab or DOM imports, so jest tests them without a lab
 * (src/__tests__/render.spec.ts). Every name and host goes through `escapeHtml`:
 * they come from whoever started the mesh.
 */

/** A worker's CPU and memory, and its GPU's where NVML lists one; its distributed
 * tensors' bytes and count once its mesh was activated (the inspector shows them). */
export interface IUsage {
  cpu: number;
  rss: number;
  gpu?: number;
  gpu_mem?: number;
  tensors?: number;
  tensor_refs?: number;
}

export interface IRank {
  rank: number;
  pid: number;
  host: string;
  state: 'alive' | 'unresponsive' | 'dead' | 'lost';
  /** For a dead rank: how it ended ("SIGKILL", "exit 1", ...). */
  why: string | null;
  restarts: number;
  usage: IUsage | null;
}

export interface IHost {
  host: string;
  addr: string;
  procs: number;
  alive: number;
  state: 'alive' | 'unreachable' | 'gone';
  /** The mesh's ranks on this host. */
  ranks: number[];
}

/** The controller that holds a mesh: a kernel (of a notebook, where known) or a script. */
export interface IOwner {
  kind: 'kernel' | 'script';
  notebook: string | null;
  kernel_id: string | null;
  pid: number;
  host: string;
}

export interface IMesh {
  name: string;
  /** "unreachable": its agents do not answer this server (another host or network
   * namespace); it may run, `why` says where, and it has no ranks to show. */
  state: 'alive' | 'degraded' | 'lost' | 'unreachable';
  /** Why the mesh is unreachable from here, where it runs and what to do; else null. */
  why: string | null;
  procs: number;
  alive: number;
  unresponsive: number;
  hosts: IHost[];
  epoch: number;
  attached: boolean;
  owner: IOwner | null;
  ephemeral: boolean;
  /** Seconds a mesh with no controller lives on. */
  idle_timeout: number;
  /** Unix time (s) at which the host agent stops the mesh; null while a controller is attached. */
  idle_deadline: number | null;
  created: number;
  ranks: IRank[];
}

/** The answer of POST /monarch/meshes/NAME/respawn. */
export interface IRespawned {
  mesh: string;
  ranks: number[];
  via: 'kernel' | 'administrator';
}

const ENTITIES: { [c: string]: string } = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;'
};

/** `text` safe inside an element and inside a quoted attribute. */
export function escapeHtml(text: string): string {
  return String(text).replace(/[&<>"']/g, c => ENTITIES[c]);
}

/** The status-bar item: "meshes: 2, procs 7/8". */
export function statusText(meshes: IMesh[]): string {
  const alive = meshes.reduce((n, m) => n + m.alive, 0);
  const total = meshes.reduce((n, m) => n + m.procs, 0);
  return `meshes: ${meshes.length}, procs ${alive}/${total}`;
}

/** Who holds the mesh: "held by kernel of analysis.ipynb" (the notebook's file name:
 * the kernel gives its full path, which the element's title shows), "no controller", ... */
export function ownerText(owner: IOwner | null): string {
  if (!owner) {
    return 'no controller';
  }
  if (owner.kind === 'kernel' && owner.notebook) {
    return `held by kernel of ${owner.notebook.split('/').pop()}`;
  }
  return `held by ${owner.kind} pid ${owner.pid} on ${owner.host}`;
}

/** "4 min 12 s", "1 h 3 min", "9 s". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s >= 3600) {
    const m = Math.floor((s % 3600) / 60);
    return `${Math.floor(s / 3600)} h` + (m ? ` ${m} min` : '');
  }
  if (s >= 60) {
    return `${Math.floor(s / 60)} min` + (s % 60 ? ` ${s % 60} s` : '');
  }
  return `${s} s`;
}

/**
 * When the host agent stops a mesh nobody holds, counted down from `now` (unix
 * seconds): "stops in 4 min 12 s unless attached"; "ephemeral" for a mesh that
 * stops with its controller; nothing while a controller is attached.
 */
export function idleText(mesh: IMesh, now: number): string {
  if (mesh.ephemeral) {
    return 'ephemeral';
  }
  if (mesh.attached || mesh.idle_deadline === null || mesh.idle_deadline === undefined) {
    return '';
  }
  const left = mesh.idle_deadline - now;
  if (left < 1) {
    return 'stopping: idle with no controller';
  }
  return `stops in ${formatDuration(left)} unless attached`;
}

/** "alive", "unresponsive", "dead (SIGKILL)", "lost". */
export function rankStateText(rank: IRank): string {
  if (rank.state === 'dead') {
    return rank.why ? `dead (${rank.why})` : 'dead';
  }
  return rank.state;
}

/** Whether the mesh has a dead rank, which is what Respawn restarts. */
export function hasDeadRank(mesh: IMesh): boolean {
  return mesh.ranks.some(r => r.state === 'dead');
}

/** The note shown in the mesh after a respawn: "respawned ranks 1, 3". */
export function respawnNote(result: IRespawned): string {
  if (!result.ranks.length) {
    return 'no dead ranks to respawn';
  }
  return `respawned ranks ${result.ranks.join(', ')}`;
}

/** The note shown while a respawn runs: where it runs, and why it may take a while. */
export function respawningNote(mesh: IMesh | undefined): string {
  return mesh?.attached
    ? 'respawning in the kernel that holds it (after its running cell, if one runs)...'
    : 'respawning...';
}

function mib(bytes: number): string {
  return `${Math.round(bytes / 2 ** 20)} MiB`;
}

function rankRow(r: IRank, gpu: boolean, restarts: boolean): string {
  const u = r.usage;
  let cells =
    `<td>${r.rank}</td><td class="monarch-rank-state">${escapeHtml(rankStateText(r))}</td>` +
    `<td>${r.pid}</td><td>${escapeHtml(r.host)}</td>` +
    `<td class="monarch-cpu">${u ? `${u.cpu}%` : ''}</td>` +
    `<td class="monarch-mem">${u ? mib(u.rss) : ''}</td>`;
  if (gpu) {
    const g = u && u.gpu !== undefined;
    cells +=
      `<td class="monarch-gpu">${g ? `${u.gpu}%` : ''}</td>` +
      `<td class="monarch-gpu-mem">${g ? mib(u.gpu_mem || 0) : ''}</td>`;
  }
  if (restarts) {
    cells += `<td class="monarch-restarts">${r.restarts}</td>`;
  }
  return (
    `<tr class="monarch-rank" data-rank="${r.rank}" data-state="${escapeHtml(r.state)}">` +
    `${cells}</tr>`
  );
}

/**
 * One mesh of the panel, as of `now` (unix seconds), with `note` (the outcome of
 * the last action on it) where there is one. The buttons carry `data-action`:
 * the panel runs the command `monarch:ACTION` for them.
 */
export function meshHtml(mesh: IMesh, now: number, note = ''): string {
  const name = escapeHtml(mesh.name);
  const hosts = mesh.hosts
    .map(h => `${escapeHtml(h.host)} (${escapeHtml(h.state)}, ${h.alive}/${h.procs})`)
    .join(', ');
  // GPU and restart columns only where some rank has something to show in them.
  const gpu = mesh.ranks.some(r => r.usage && r.usage.gpu !== undefined);
  const restarts = mesh.ranks.some(r => r.restarts > 0);
  const head =
    '<tr><th>rank</th><th>state</th><th>pid</th><th>host</th><th>CPU</th><th>memory</th>' +
    (gpu ? '<th>GPU</th><th>GPU mem</th>' : '') +
    (restarts ? '<th>restarts</th>' : '') +
    '</tr>';
  const unresponsive = mesh.unresponsive ? `, ${mesh.unresponsive} unresponsive` : '';
  const respawn = hasDeadRank(mesh)
    ? '<button data-action="respawn" title="Restart the dead ranks with their actors">'
    : '<button data-action="respawn" disabled title="No rank is dead">';
  return (
    `<div class="monarch-mesh" data-mesh="${name}">` +
    `<div><b>${name}</b> <span class="monarch-mesh-state" data-state="${escapeHtml(mesh.state)}">` +
    `${escapeHtml(mesh.state)}</span> ${mesh.alive}/${mesh.procs} procs alive${unresponsive}, ` +
    `epoch ${mesh.epoch}</div>` +
    `<div><span class="monarch-owner" title="${escapeHtml(mesh.owner?.notebook || '')}">` +
    `${escapeHtml(ownerText(mesh.owner))}</span> ` +
    `<span class="monarch-idle">${escapeHtml(idleText(mesh, now))}</span></div>` +
    `<div class="monarch-hosts">hosts: ${hosts}</div>` +
    (mesh.why ? `<div class="monarch-why">${escapeHtml(mesh.why)}</div>` : '') +
    `<table>${head}${mesh.ranks.map(r => rankRow(r, gpu, restarts)).join('')}</table>` +
    (note ? `<div class="monarch-note">${escapeHtml(note)}</div>` : '') +
    '<div class="monarch-actions">' +
    '<button data-action="attach">Attach in notebook</button>' +
    '<button data-action="logs">Logs</button>' +
    '<button data-action="stacks">Stacks</button>' +
    `${respawn}Respawn</button>` +
    '<button data-action="down">Down</button></div></div>'
  );
}
