/**
 * The Meshes side panel of monarch-kernel: every running mesh of this user, live,
 * from the server extension (`monarch_kernel.server`): the same data `monarch-kernel
 * ls` shows. Actions: attach in the active notebook, logs, down. A status-bar item
 * says "meshes: N, procs alive/total" and opens the panel.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  MainAreaWidget,
  showDialog
} from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

interface IUsage {
  cpu: number;
  rss: number;
  gpu?: number;
  gpu_mem?: number;
}

interface IRank {
  usage: IUsage | null;
  rank: number;
  pid: number;
  host: string;
  state: string;
  signal_name: string | null;
  exit_code: number;
  restarts: number;
}

interface IMesh {
  name: string;
  state: string;
  procs: number;
  alive: number;
  epoch: number;
  attached: boolean;
  ephemeral: boolean;
  idle_timeout: number;
  age: number;
  hosts: { host: string; state: string; procs: number; alive: number }[];
  ranks: IRank[];
}

const PANEL_ID = 'monarch-meshes';

function escape(text: string): string {
  const div = document.createElement('div');
  div.textContent = text;
  return div.innerHTML;
}

/** What the server says, kept up to date by its event stream. */
class Meshes {
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

  async request(path: string, method = 'GET'): Promise<any> {
    const url = URLExt.join(this.settings.baseUrl, 'monarch', 'meshes', path);
    const response = await ServerConnection.makeRequest(url, { method }, this.settings);
    const body = await response.json();
    if (!response.ok) {
      throw new Error(body.message || response.statusText);
    }
    return body;
  }
}

class MeshesPanel extends Widget {
  constructor(private data: Meshes, private app: JupyterFrontEnd) {
    super();
    this.id = PANEL_ID;
    this.addClass('monarch-panel');
    this.title.caption = 'Meshes';
    this.title.label = 'Meshes';
    data.changed(() => this.draw());
    this.draw();
  }

  draw(): void {
    const meshes = this.data.meshes;
    if (!meshes.length) {
      this.node.innerHTML = '<div class="monarch-empty">no running meshes</div>';
      return;
    }
    this.node.innerHTML = meshes
      .map(m => {
        const hosts = m.hosts.map(h => `${escape(h.host)} (${h.state})`).join(', ');
        const gpu = m.ranks.some(r => r.usage && r.usage.gpu !== undefined);
        const rows = m.ranks
          .map(r => {
            const u = r.usage;
            const cpu = u ? `${u.cpu}%` : '';
            const mem = u ? `${Math.round(u.rss / 2 ** 20)} MiB` : '';
            const g =
              gpu && u && u.gpu !== undefined
                ? `<td>${u.gpu}%</td><td>${Math.round((u.gpu_mem || 0) / 2 ** 20)} MiB</td>`
                : gpu
                  ? '<td></td><td></td>'
                  : '';
            return (
              `<tr class="monarch-rank" data-rank="${r.rank}" data-state="${escape(r.state)}">` +
              `<td>${r.rank}</td><td class="monarch-rank-state">${
                r.state === 'running' ? 'alive' : escape(r.signal_name || r.state)
              }</td><td>${r.pid}</td><td>${escape(r.host)}</td>` +
              `<td class="monarch-cpu">${cpu}</td><td class="monarch-mem">${mem}</td>${g}</tr>`
            );
          })
          .join('');
        const gpuHead = gpu ? '<th>GPU</th><th>GPU mem</th>' : '';
        const idle = m.ephemeral ? 'ephemeral' : `idle timeout ${Math.round(m.idle_timeout)} s`;
        return (
          `<div class="monarch-mesh" data-mesh="${escape(m.name)}">` +
          `<div><b>${escape(m.name)}</b> <span class="monarch-mesh-state" data-state="${escape(
            m.state
          )}">${escape(m.state)}</span> ${m.alive}/${m.procs} procs alive, epoch ${m.epoch}, ` +
          `${m.attached ? 'attached' : 'no controller'}, ${idle}</div>` +
          `<div class="monarch-hosts">hosts: ${hosts}</div>` +
          '<table><tr><th>rank</th><th>state</th><th>pid</th><th>host</th>' +
          `<th>CPU</th><th>memory</th>${gpuHead}</tr>` +
          rows +
          '</table><div class="monarch-actions">' +
          `<button data-action="attach">Attach in notebook</button>` +
          `<button data-action="logs">Logs</button>` +
          `<button data-action="stacks">Stacks</button>` +
          `<button data-action="down">Down</button></div></div>`
        );
      })
      .join('');
    this.node.querySelectorAll('.monarch-mesh').forEach(el => {
      const name = (el as HTMLElement).dataset.mesh as string;
      el.querySelectorAll('button').forEach(b => {
        const action = (b as HTMLElement).dataset.action as string;
        b.addEventListener('click', () =>
          this.app.commands.execute(`monarch:${action}`, { name })
        );
      });
    });
  }
}

/** A main-area tab that tails a mesh's output, filterable by rank. */
class LogsView extends Widget {
  private timer: number;
  private rank: HTMLInputElement;
  private lines: HTMLElement;

  constructor(private data: Meshes, private mesh: string) {
    super();
    this.addClass('monarch-logs-view');
    this.node.innerHTML =
      '<div>rank <input class="monarch-logs-rank" size="4" placeholder="all"></div>' +
      '<div class="monarch-logs"></div>';
    this.rank = this.node.querySelector('.monarch-logs-rank') as HTMLInputElement;
    this.lines = this.node.querySelector('.monarch-logs') as HTMLElement;
    this.timer = window.setInterval(() => void this.refresh(), 1000);
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const rank = this.rank.value.trim();
    const query = `logs?tail=500${rank ? `&rank=${encodeURIComponent(rank)}` : ''}`;
    try {
      const body = await this.data.request(`${encodeURIComponent(this.mesh)}/${query}`);
      this.lines.textContent = body.lines.join('\n');
    } catch (e) {
      this.lines.textContent = `(${(e as Error).message})`;
    }
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'monarch-kernel-panel:plugin',
  description: 'The Meshes side panel of monarch-kernel',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null
  ) => {
    const data = new Meshes(ServerConnection.makeSettings());
    const panel = new MeshesPanel(data, app);
    app.shell.add(panel, 'left', { rank: 900 });

    app.commands.addCommand('monarch:open-panel', {
      label: 'Monarch: Show the meshes panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand('monarch:attach', {
      label: 'Monarch: Attach to a mesh in the notebook',
      execute: async args => {
        const name = args.name as string;
        const nb = notebooks.currentWidget;
        if (!nb || nb.sessionContext.session?.kernel?.name !== 'monarch') {
          const result = await showDialog({
            title: 'No notebook on the monarch kernel',
            body: `Open a notebook on the monarch kernel to attach to ${name}.`,
            buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'New notebook' })]
          });
          if (result.button.accept) {
            await app.commands.execute('notebook:create-new', { kernelName: 'monarch' });
          }
          return;
        }
        const notebook = nb.content;
        notebook.activeCellIndex = notebook.widgets.length - 1;
        NotebookActions.insertBelow(notebook);
        const cell = notebook.activeCell;
        if (cell) {
          cell.model.sharedModel.setSource(`procs = %mesh attach ${name}`);
          await NotebookActions.run(notebook, nb.sessionContext);
        }
      }
    });
    app.commands.addCommand('monarch:logs', {
      label: 'Monarch: Logs of a mesh',
      execute: args => {
        const name = args.name as string;
        const view = new MainAreaWidget({ content: new LogsView(data, name) });
        view.id = `monarch-logs-${name}`;
        view.title.label = `Logs: ${name}`;
        view.title.closable = true;
        app.shell.add(view, 'main');
      }
    });
    app.commands.addCommand('monarch:stacks', {
      label: 'Monarch: Stacks of a mesh',
      execute: async args => {
        const name = args.name as string;
        const content = new Widget();
        content.addClass('monarch-logs');
        content.node.textContent = 'asking the workers...';
        const view = new MainAreaWidget({ content });
        view.id = `monarch-stacks-${name}`;
        view.title.label = `Stacks: ${name}`;
        view.title.closable = true;
        app.shell.add(view, 'main');
        try {
          const body = await data.request(`${encodeURIComponent(name)}/stacks`);
          content.node.textContent = body.ranks
            .map((r: { rank: number; stacks: string }) => `--- rank ${r.rank} ---\n${r.stacks}`)
            .join('\n');
        } catch (e) {
          content.node.textContent = `(${(e as Error).message})`;
        }
      }
    });
    app.commands.addCommand('monarch:down', {
      label: 'Monarch: Stop a mesh',
      execute: async args => {
        const name = args.name as string;
        const result = await showDialog({
          title: `Stop mesh ${name}?`,
          body: `Its workers and agents stop, and its state is lost.`,
          buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: `Stop ${name}` })]
        });
        if (result.button.accept) {
          await data.request(`${encodeURIComponent(name)}/down`, 'POST');
        }
      }
    });
    if (palette) {
      palette.addItem({ command: 'monarch:open-panel', category: 'Monarch' });
    }
    if (statusBar) {
      const item = new Widget();
      item.addClass('monarch-status');
      item.node.style.cursor = 'pointer';
      item.node.addEventListener('click', () => app.shell.activateById(PANEL_ID));
      const draw = () => {
        const alive = data.meshes.reduce((n, m) => n + m.alive, 0);
        const total = data.meshes.reduce((n, m) => n + m.procs, 0);
        item.node.textContent = `meshes: ${data.meshes.length}, procs ${alive}/${total}`;
      };
      data.changed(draw);
      draw();
      statusBar.registerStatusItem('monarch-kernel-panel:status', { item, align: 'left' });
    }
    data.start();
  }
};

export default plugin;
