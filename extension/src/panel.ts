/**
 * The Meshes side panel: every mesh of the store (model.ts) as render.ts draws it,
 * redrawn on each server event, with the idle countdowns ticked here between events
 * and the outcome of an action (a note) shown in its mesh for a while. Its buttons
 * run the commands `monarch:ACTION` (commands.ts) for their mesh.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { Meshes } from './model';
import { idleText, meshHtml } from './render';

/** The panel's widget id: the status bar and `monarch:open-panel` activate it. */
export const PANEL_ID = 'monarch-meshes';

/** How long a note (the outcome of an action) stays in its mesh. */
const NOTE_SECONDS = 30;

export class MeshesPanel extends Widget {
  /** Notes by mesh name, kept here because every server event redraws the meshes. */
  private notes = new Map<string, { text: string; until: number }>();
  /** The rank clicked in each large mesh's grid: its details show below the grid. */
  private selected = new Map<string, number>();
  /** Ticks the idle countdowns on the client: the server sends an event only on a change. */
  private ticker: number;

  constructor(
    private data: Meshes,
    private app: JupyterFrontEnd
  ) {
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
      .map(m => meshHtml(m, now, this.notes.get(m.name)?.text, this.selected.get(m.name) ?? null))
      .join('');
    this.node.querySelectorAll('.monarch-mesh').forEach(el => {
      const name = (el as HTMLElement).dataset.mesh as string;
      el.querySelectorAll('button').forEach(b => {
        const action = (b as HTMLElement).dataset.action as string;
        b.addEventListener('click', () => this.app.commands.execute(`monarch:${action}`, { name }));
      });
      el.querySelectorAll('.monarch-cell').forEach(c => {
        c.addEventListener('click', () => {
          this.selected.set(name, Number((c as HTMLElement).dataset.rank));
          this.draw();
        });
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
