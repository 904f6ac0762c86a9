/**
 * The Meshes side panel of monarch-kernel: every running mesh of this user, live,
 * from the server extension (`monarch_kernel.server`): the same data `monarch-kernel
 * ls` shows. Actions: attach in the active notebook, logs, stacks, respawn the dead
 * ranks, down; each is also a palette command that asks for the mesh. A status-bar
 * item says "meshes: N, procs alive/total" and opens the panel. What the panel
 * shows is drawn by render.ts; this file wires it into JupyterLab.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  MainAreaWidget,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import {
  IMesh,
  IRespawned,
  idleText,
  meshHtml,
  respawnNote,
  respawningNote,
  statusText
} from './render';

const PANEL_ID = 'monarch-meshes';

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

  /** The server's JSON answer about mesh `name` (`what`: logs, stacks, respawn, down,
   * with its query); an Error with its `message` for anything but a 2xx. */
  async request(name: string, what: string, method = 'GET'): Promise<any> {
    const url = URLExt.join(
      this.settings.baseUrl,
      'monarch',
      'meshes',
      encodeURIComponent(name),
      what
    );
    const response = await ServerConnection.makeRequest(url, { method }, this.settings);
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // Not JSON (a proxy's error page): the status line says what there is to say.
    }
    if (!response.ok) {
      throw new Error(body?.message || `${response.status} ${response.statusText}`);
    }
    return body;
  }
}

/** How long a note (the outcome of an action) stays in its mesh. */
const NOTE_SECONDS = 30;

class MeshesPanel extends Widget {
  /** Notes by mesh name, kept here because every server event redraws the meshes. */
  private notes = new Map<string, { text: string; until: number }>();
  /** Ticks the idle countdowns on the client: the server sends an event only on a change. */
  private ticker: number;

  constructor(private data: Meshes, private app: JupyterFrontEnd) {
    super();
    this.id = PANEL_ID;
    this.addClass('monarch-panel');
    this.title.caption = 'Meshes';
    this.title.label = 'Meshes';
    data.changed(() => this.draw());
    this.ticker = window.setInterval(() => this.tick(), 1000);
    this.draw();
  }

  /** Shows `text` in mesh `name` for a while. */
  note(name: string, text: string): void {
    this.notes.set(name, { text, until: Date.now() / 1000 + NOTE_SECONDS });
    this.draw();
  }

  draw(): void {
    const meshes = this.data.meshes;
    if (!meshes.length) {
      this.node.innerHTML = '<div class="monarch-empty">no running meshes</div>';
      return;
    }
    const now = Date.now() / 1000;
    for (const [name, note] of this.notes) {
      if (note.until < now) {
        this.notes.delete(name);
      }
    }
    this.node.innerHTML = meshes
      .map(m => meshHtml(m, now, this.notes.get(m.name)?.text))
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

  /** Updates the countdowns in place (a redraw would drop a hovered button's state). */
  private tick(): void {
    const now = Date.now() / 1000;
    const meshes = new Map(this.data.meshes.map(m => [m.name, m]));
    this.node.querySelectorAll('.monarch-mesh').forEach(el => {
      const mesh = meshes.get((el as HTMLElement).dataset.mesh as string);
      const idle = el.querySelector('.monarch-idle');
      if (mesh && idle) {
        idle.textContent = idleText(mesh, now);
      }
    });
    if ([...this.notes.values()].some(n => n.until < now)) {
      this.draw();
    }
  }

  dispose(): void {
    window.clearInterval(this.ticker);
    super.dispose();
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
      const body = await this.data.request(this.mesh, query);
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

    /** The mesh a command is for: its `name` argument, else the user's pick (null: none). */
    const meshName = async (args: { name?: unknown }, verb: string): Promise<string | null> => {
      if (typeof args.name === 'string' && args.name) {
        return args.name;
      }
      const names = data.meshes.map(m => m.name);
      if (!names.length) {
        await showDialog({
          title: 'No running meshes',
          body: 'Start one from a notebook on the monarch kernel (%mesh up NAME) or a script.',
          buttons: [Dialog.okButton()]
        });
        return null;
      }
      const result = await InputDialog.getItem({ title: `${verb} which mesh?`, items: names });
      return result.button.accept ? result.value : null;
    };

    /** A command `monarch:ID` acting on one mesh (see `meshName`), in the palette too. */
    const meshCommand = (
      id: string,
      label: string,
      verb: string,
      run: (name: string) => Promise<void> | void
    ): void => {
      app.commands.addCommand(`monarch:${id}`, {
        label,
        execute: async args => {
          const name = await meshName(args, verb);
          if (name) {
            await run(name);
          }
        }
      });
      palette?.addItem({ command: `monarch:${id}`, category: 'Monarch' });
    };

    /** A closable main-area tab `title: name` holding `content`. */
    const openTab = (kind: string, title: string, name: string, content: Widget): void => {
      const view = new MainAreaWidget({ content });
      view.id = `monarch-${kind}-${name}`;
      view.title.label = `${title}: ${name}`;
      view.title.closable = true;
      app.shell.add(view, 'main');
    };

    app.commands.addCommand('monarch:open-panel', {
      label: 'Monarch: Show the meshes panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: 'monarch:open-panel', category: 'Monarch' });
    meshCommand(
      'attach',
      'Monarch: Attach to a mesh in the notebook',
      'Attach to',
      async name => {
        let nb = notebooks.currentWidget;
        if (!nb || nb.sessionContext.session?.kernel?.name !== 'monarch') {
          const result = await showDialog({
            title: 'No notebook on the monarch kernel',
            body: `Open a new notebook on the monarch kernel attached to ${name}?`,
            buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'New notebook' })]
          });
          if (!result.button.accept) {
            return;
          }
          nb = (await app.commands.execute('notebook:create-new', {
            kernelName: 'monarch'
          })) as NotebookPanel;
          await nb.sessionContext.ready;
        }
        const notebook = nb.content;
        notebook.activeCellIndex = notebook.widgets.length - 1;
        // A new notebook's one cell is empty: use it rather than add one below it.
        if (notebook.activeCell?.model.sharedModel.getSource().trim()) {
          NotebookActions.insertBelow(notebook);
        }
        const cell = notebook.activeCell;
        if (cell) {
          cell.model.sharedModel.setSource(`procs = %mesh attach ${name}`);
          await NotebookActions.run(notebook, nb.sessionContext);
        }
      }
    );
    meshCommand('logs', 'Monarch: Logs of a mesh', 'Show the logs of', name =>
      openTab('logs', 'Logs', name, new LogsView(data, name))
    );
    meshCommand('stacks', 'Monarch: Stacks of a mesh', 'Show the stacks of', async name => {
      const content = new Widget();
      content.addClass('monarch-logs');
      content.node.textContent = 'asking the workers...';
      openTab('stacks', 'Stacks', name, content);
      try {
        const body = await data.request(name, 'stacks');
        content.node.textContent = body.ranks
          .map((r: { rank: number; stacks: string }) => `--- rank ${r.rank} ---\n${r.stacks}`)
          .join('\n');
      } catch (e) {
        content.node.textContent = `(${(e as Error).message})`;
      }
    });
    meshCommand(
      'respawn',
      'Monarch: Respawn the dead ranks of a mesh',
      'Respawn the dead ranks of',
      async name => {
        panel.note(name, respawningNote(data.meshes.find(m => m.name === name)));
        try {
          const body: IRespawned = await data.request(name, 'respawn', 'POST');
          panel.note(name, respawnNote(body));
        } catch (e) {
          panel.note(name, 'the respawn failed');
          await showErrorMessage(`Could not respawn ${name}`, (e as Error).message);
        }
      }
    );
    meshCommand('down', 'Monarch: Stop a mesh', 'Stop', async name => {
      const result = await showDialog({
        title: `Stop mesh ${name}?`,
        body: 'Its workers and agents stop, and its state is lost.',
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: `Stop ${name}` })]
      });
      if (result.button.accept) {
        try {
          await data.request(name, 'down', 'POST');
        } catch (e) {
          await showErrorMessage(`Could not stop ${name}`, (e as Error).message);
        }
      }
    });
    if (statusBar) {
      const item = new Widget();
      item.addClass('monarch-status');
      item.node.style.cursor = 'pointer';
      item.node.addEventListener('click', () => app.shell.activateById(PANEL_ID));
      const draw = () => {
        item.node.textContent = statusText(data.meshes);
      };
      data.changed(draw);
      draw();
      statusBar.registerStatusItem('monarch-kernel-panel:status', { item, align: 'left' });
    }
    data.start();
  }
};

export default plugin;
