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

/** A mesh with at least this many ranks shows them as a grid by host (one small cell
 * per rank, its details in its tooltip and on click) instead of a table row each. */
export const GRID_FROM = 33;

/** A rank's details, one line: "rank 5 · alive · pid 1234 · CPU 3% · 20 MiB". */
export function rankSummary(r: IRank): string {
  const parts = [`rank ${r.rank}`, rankStateText(r), `pid ${r.pid}`];
  const u = r.usage;
  if (u) {
    parts.push(`CPU ${u.cpu}%`, mib(u.rss));
    if (u.gpu !== undefined) {
      parts.push(`GPU ${u.gpu}%`, `GPU mem ${mib(u.gpu_mem || 0)}`);
    }
  }
  if (r.restarts) {
    parts.push(`${r.restarts} restarts`);
  }
  return parts.join(' · ');
}

/** How busy a rank is, 0 to 1: its GPU's use where it has one, else its CPU's. */
function load(r: IRank): number {
  const u = r.usage;
  if (!u) {
    return 0;
  }
  const pct = u.gpu !== undefined ? u.gpu : u.cpu;
  return Math.max(0, Math.min(1, pct / 100));
}

/** The ranks of each host, in the order of `mesh.hosts` (then any other host). */
export function ranksByHost(mesh: IMesh): [string, IRank[]][] {
  const by = new Map<string, IRank[]>();
  for (const h of mesh.hosts) {
    by.set(h.host, []);
  }
  for (const r of mesh.ranks) {
    const list = by.get(r.host) || [];
    list.push(r);
    by.set(r.host, list);
  }
  return [...by.entries()].filter(([, rs]) => rs.length > 0);
}

/** One host of the grid: its name and summary ("16/16 alive · CPU 4% · 320 MiB"),
 * then a cell per rank coloured by state, shaded by load. */
function hostGrid(host: string, ranks: IRank[], selected: number | null): string {
  const alive = ranks.filter(r => r.state === 'alive').length;
  const used = ranks.filter(r => r.usage);
  const cpu = used.length ? used.reduce((n, r) => n + (r.usage?.cpu || 0), 0) / used.length : null;
  const rss = used.reduce((n, r) => n + (r.usage?.rss || 0), 0);
  const summary =
    `${alive}/${ranks.length} alive` +
    (cpu !== null ? ` · CPU ${Math.round(cpu)}% · ${mib(rss)}` : '');
  const cells = ranks
    .map(
      r =>
        `<span class="monarch-cell${r.rank === selected ? ' monarch-selected' : ''}" ` +
        `data-rank="${r.rank}" data-state="${escapeHtml(r.state)}" ` +
        `style="--monarch-load:${load(r).toFixed(2)}" title="${escapeHtml(rankSummary(r))}"></span>`
    )
    .join('');
  return (
    `<div class="monarch-host" data-host="${escapeHtml(host)}">` +
    `<div class="monarch-host-head"><b>${escapeHtml(host)}</b> ` +
    `<span class="monarch-host-summary">${summary}</span></div>` +
    `<div class="monarch-grid">${cells}</div></div>`
  );
}

/** The grid of a large mesh's ranks, by host, and the details line of the rank
 * `selected` (clicked), if any. */
export function gridHtml(mesh: IMesh, selected: number | null = null): string {
  const hosts = ranksByHost(mesh)
    .map(([h, rs]) => hostGrid(h, rs, selected))
    .join('');
  const picked = mesh.ranks.find(r => r.rank === selected);
  const detail = picked
    ? `<div class="monarch-detail">${escapeHtml(rankSummary(picked))}</div>`
    : '';
  return `<div class="monarch-hosts-grid">${hosts}</div>${detail}`;
}

/** A button in JupyterLab's own toolbar style. */
function button(action: string, label: string, title = '', disabled = false): string {
  return (
    `<button class="jp-ToolbarButtonComponent jp-mod-minimal jp-Button" data-action="${action}"` +
    (title ? ` title="${escapeHtml(title)}"` : '') +
    (disabled ? ' disabled' : '') +
    `><span class="jp-ToolbarButtonComponent-label">${escapeHtml(label)}</span></button>`
  );
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
export function meshHtml(
  mesh: IMesh,
  now: number,
  note = '',
  selected: number | null = null
): string {
  const name = escapeHtml(mesh.name);
  const grid = mesh.ranks.length >= GRID_FROM;
  const hosts = mesh.hosts.filter(h => h.state !== 'alive' || !grid);
  const hostsText = hosts
    .map(h => `${escapeHtml(h.host)} (${escapeHtml(h.state)}, ${h.alive}/${h.procs})`)
    .join(', ');
  const hostsLine = grid
    ? `<div class="monarch-hosts">${mesh.hosts.length} host${mesh.hosts.length === 1 ? '' : 's'}` +
      (hosts.length ? `; not alive: ${hostsText}` : '') +
      '</div>'
    : `<div class="monarch-hosts">hosts: ${hostsText}</div>`;
  // GPU and restart columns only where some rank has something to show in them.
  const gpu = mesh.ranks.some(r => r.usage && r.usage.gpu !== undefined);
  const restarts = mesh.ranks.some(r => r.restarts > 0);
  const head =
    '<tr><th>rank</th><th>state</th><th>pid</th><th>host</th><th>CPU</th><th>memory</th>' +
    (gpu ? '<th>GPU</th><th>GPU mem</th>' : '') +
    (restarts ? '<th>restarts</th>' : '') +
    '</tr>';
  const ranks = grid
    ? gridHtml(mesh, selected)
    : `<table>${head}${mesh.ranks.map(r => rankRow(r, gpu, restarts)).join('')}</table>`;
  const unresponsive = mesh.unresponsive ? `, ${mesh.unresponsive} unresponsive` : '';
  const dead = hasDeadRank(mesh);
  return (
    `<div class="monarch-mesh" data-mesh="${name}">` +
    `<div><b>${name}</b> <span class="monarch-mesh-state" data-state="${escapeHtml(mesh.state)}">` +
    `${escapeHtml(mesh.state)}</span> ${mesh.alive}/${mesh.procs} procs alive${unresponsive}, ` +
    `epoch ${mesh.epoch}</div>` +
    `<div><span class="monarch-owner" title="${escapeHtml(mesh.owner?.notebook || '')}">` +
    `${escapeHtml(ownerText(mesh.owner))}</span> ` +
    `<span class="monarch-idle">${escapeHtml(idleText(mesh, now))}</span></div>` +
    hostsLine +
    (mesh.why ? `<div class="monarch-why">${escapeHtml(mesh.why)}</div>` : '') +
    ranks +
    (note ? `<div class="monarch-note">${escapeHtml(note)}</div>` : '') +
    '<div class="monarch-actions">' +
    button('attach', 'Attach in notebook') +
    button('logs', 'Logs') +
    button('stacks', 'Stacks') +
    button(
      'respawn',
      'Respawn',
      dead ? 'Restart the dead ranks with their actors' : 'No rank is dead',
      !dead
    ) +
    button('down', 'Down') +
    '</div></div>'
  );
}
