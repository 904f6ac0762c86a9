/**
 * The panel's commands, each also in the palette (category Monarch):
 * `monarch:open-panel`, and one per action on a mesh (`monarch:attach`, `logs`,
 * `stacks`, `respawn`, `down`), which the panel's buttons run with the mesh's `name`
 * and which ask for the mesh when run without one. They act through the store
 * (model.ts) and report in the panel (its notes), in tabs and in dialogs.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  InputDialog,
  MainAreaWidget,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { LogsView } from './logs';
import { IStacks, Meshes } from './model';
import { MeshesPanel, PANEL_ID } from './panel';
import { IRespawned, respawnNote, respawningNote } from './render';

/** Adds the commands (and their palette items, where there is a palette). */
export function addCommands(
  app: JupyterFrontEnd,
  data: Meshes,
  panel: MeshesPanel,
  notebooks: INotebookTracker,
  palette: ICommandPalette | null
): void {
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
  meshCommand('attach', 'Monarch: Attach to a mesh in the notebook', 'Attach to', async name => {
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
  });
  meshCommand('logs', 'Monarch: Logs of a mesh', 'Show the logs of', name =>
    openTab('logs', 'Logs', name, new LogsView(data, name))
  );
  meshCommand('stacks', 'Monarch: Stacks of a mesh', 'Show the stacks of', async name => {
    const content = new Widget();
    content.addClass('monarch-logs');
    content.node.textContent = 'asking the workers...';
    openTab('stacks', 'Stacks', name, content);
    try {
      const body = await data.request<IStacks>(name, 'stacks');
      content.node.textContent = body.ranks
        .map(r => `--- rank ${r.rank} ---\n${r.stacks}`)
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
        const body = await data.request<IRespawned>(name, 'respawn', 'POST');
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
}
