/**
 * The status-bar item: "meshes: N, procs alive/total" (render.ts's `statusText`),
 * redrawn on each change of the store (model.ts); a click opens the Meshes panel.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { Meshes } from './model';
import { PANEL_ID } from './panel';
import { statusText } from './render';

/** Adds the item to the left of `statusBar`. */
export function addStatusItem(app: JupyterFrontEnd, data: Meshes, statusBar: IStatusBar): void {
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
