/**
 * The Logs view that `monarch:logs` opens in a main-area tab: the last 500 lines of
 * a mesh's output (or of one rank's), asked of the server every second through the
 * store (model.ts) while the tab is open.
 */
import { Widget } from '@lumino/widgets';

import { ILogs, Meshes } from './model';

/** A main-area tab that tails a mesh's output, filterable by rank. */
export class LogsView extends Widget {
  private timer: number;
  private rank: HTMLInputElement;
  private lines: HTMLElement;

  constructor(
    private data: Meshes,
    private mesh: string
  ) {
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
      const body = await this.data.request<ILogs>(this.mesh, query);
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
