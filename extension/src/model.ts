/**
 * The panel's store: the meshes the server extension (`monarch_kernel.server`)
 * reports, kept up to date by its event stream (`/monarch/events`), and the one way
 * to ask it about one mesh (`/monarch/meshes/NAME/...`: logs, stacks, respawn, down).
 * The panel, the commands and the status bar read `meshes` and redraw on `changed`;
 * none of them talks to the server another way. No widgets here.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IMesh } from './render';

/** The answer of GET /monarch/meshes/NAME/logs: the lines each rank printed, labelled
 * `[rank N]`, in the order printed. */
export interface ILogs {
  mesh: string;
  lines: string[];
}

/** The answer of GET /monarch/meshes/NAME/stacks: what each running worker runs now. */
export interface IStacks {
  mesh: string;
  ranks: { rank: number; stacks: string }[];
}

/** What the server says, kept up to date by its event stream. */
export class Meshes {
  meshes: IMesh[] = [];
  private listeners: (() => void)[] = [];
  private source: EventSource | null = null;

  constructor(private settings: ServerConnection.ISettings) {}

  start(): void {
    let url = URLExt.join(this.settings.baseUrl, 'monarch', 'events');
    if (this.settings.token) {
      url += `?token=${encodeURIComponent(this.settings.token)}`;
    }
    this.source = new EventSource(url);
    this.source.onmessage = (ev: MessageEvent) => {
      this.meshes = JSON.parse(ev.data).meshes;
      this.listeners.forEach(f => f());
    };
  }

  changed(f: () => void): void {
    this.listeners.push(f);
  }

  /** The server's JSON answer about mesh `name` (`what`: logs, stacks, respawn, down,
   * with its query); an Error with its `message` for anything but a 2xx. `T` is the
   * answer's shape as the caller reads it: not checked here. */
  async request<T = unknown>(name: string, what: string, method = 'GET'): Promise<T> {
    const url = URLExt.join(
      this.settings.baseUrl,
      'monarch',
      'meshes',
      encodeURIComponent(name),
      what
    );
    const response = await ServerConnection.makeRequest(url, { method }, this.settings);
    const text = await response.text();
    let body: unknown = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // Not JSON (a proxy's error page): the status line says what there is to say.
    }
    if (!response.ok) {
      const message = (body as { message?: string } | null)?.message;
      throw new Error(message || `${response.status} ${response.statusText}`);
    }
    return body as T;
  }
}
