/**
 * The Meshes side panel of monarch-kernel: every running mesh of this user, live,
 * from the server extension (`monarch_kernel.server`): the same data `monarch-kernel
 * ls` shows. Actions: attach in the active notebook, logs, stacks, respawn the dead
 * ranks, down; each is also a palette command that asks for the mesh. A status-bar
 * item says "meshes: N, procs alive/total" and opens the panel. What the panel
 * shows is drawn by render.ts; this file wires it into JupyterLab.
 *
 * One concern a module: model.ts (the store, fed by the server's event stream),
 * panel.ts (the Meshes panel), logs.ts (the Logs tab), commands.ts (the commands and
 * their palette items), status.ts (the status-bar item), render.ts (the drawing, pure).
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';

import { addCommands } from './commands';
import { Meshes } from './model';
import { MeshesPanel } from './panel';
import { addStatusItem } from './status';

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
    addCommands(app, data, panel, notebooks, palette);
    if (statusBar) {
      addStatusItem(app, data, statusBar);
    }
    data.start();
  }
};

export default plugin;
