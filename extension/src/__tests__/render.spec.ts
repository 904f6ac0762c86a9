/**
 * What the Meshes panel shows, from the server's JSON (render.ts), read back the
 * way a user sees it: the HTML parsed by jsdom.
 */
import { NOW, mesh, rank } from './fixtures';
import {
  IMesh,
  GRID_FROM,
  escapeHtml,
  formatDuration,
  hasDeadRank,
  idleText,
  meshHtml,
  ownerText,
  rankStateText,
  rankSummary,
  respawnNote,
  respawningNote,
  statusText
} from '../render';

/** The mesh's HTML as the browser builds it. */
function rendered(m: IMesh, note = ''): HTMLElement {
  const div = document.createElement('div');
  div.innerHTML = meshHtml(m, NOW, note);
  return div.querySelector('.monarch-mesh') as HTMLElement;
}

describe('ranks', () => {
  it('names the signal that killed a dead rank', () => {
    const m = mesh({
      state: 'degraded',
      alive: 1,
      ranks: [rank(0), rank(1, { state: 'dead', why: 'SIGKILL', usage: null })]
    });
    const row = rendered(m).querySelector('.monarch-rank[data-rank="1"]') as HTMLElement;
    expect(row.dataset.state).toBe('dead');
    expect(row.querySelector('.monarch-rank-state')?.textContent).toBe('dead (SIGKILL)');
    expect(row.querySelector('.monarch-mem')?.textContent).toBe('');
  });

  it('says each state in words', () => {
    expect(rankStateText(rank(0))).toBe('alive');
    expect(rankStateText(rank(0, { state: 'unresponsive' }))).toBe('unresponsive');
    expect(rankStateText(rank(0, { state: 'dead', why: 'exit 1' }))).toBe('dead (exit 1)');
    expect(rankStateText(rank(0, { state: 'dead' }))).toBe('dead');
    expect(rankStateText(rank(0, { state: 'lost' }))).toBe('lost');
  });

  it('keeps the pid in the third cell and shows memory in MiB', () => {
    const row = rendered(mesh()).querySelector('.monarch-rank[data-rank="0"]') as HTMLElement;
    expect(row.querySelectorAll('td')[2].textContent).toBe('1000');
    expect(row.querySelector('.monarch-mem')?.textContent).toBe('200 MiB');
    expect(row.querySelector('.monarch-cpu')?.textContent).toBe('1.5%');
  });

  it('shows a restarts column only once a rank was restarted', () => {
    expect(rendered(mesh()).querySelector('.monarch-restarts')).toBeNull();
    const m = mesh({ ranks: [rank(0), rank(1, { restarts: 2 })] });
    const cells = rendered(m).querySelectorAll('.monarch-restarts');
    expect([...cells].map(c => c.textContent)).toEqual(['0', '2']);
  });
});

describe('GPU columns', () => {
  it('are absent when no rank has GPU figures', () => {
    const el = rendered(mesh());
    expect(el.querySelector('.monarch-gpu')).toBeNull();
    expect(el.textContent).not.toContain('GPU');
  });

  it('are in every row once some rank has GPU figures', () => {
    const gpu = { cpu: 3, rss: 2 ** 30, gpu: 87, gpu_mem: 4 * 2 ** 30 };
    const el = rendered(mesh({ ranks: [rank(0, { usage: gpu }), rank(1)] }));
    expect(el.querySelectorAll('th')).toHaveLength(8);
    const cells = el.querySelectorAll('.monarch-gpu');
    expect([...cells].map(c => c.textContent)).toEqual(['87%', '']);
    expect(el.querySelector('.monarch-rank[data-rank="0"] .monarch-gpu-mem')?.textContent).toBe(
      '4096 MiB'
    );
  });
});

describe('escaping', () => {
  const hostile = 'x"><img src=x onerror="alert(1)">';

  it('turns markup into text', () => {
    expect(escapeHtml('<a href="x">&\'</a>')).toBe(
      '&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;'
    );
  });

  it('keeps a hostile mesh or host name out of the page structure', () => {
    const m = mesh({
      name: hostile,
      hosts: [
        {
          host: '<script>x()</script>',
          addr: '',
          procs: 2,
          alive: 2,
          state: 'alive',
          ranks: [0, 1]
        }
      ],
      ranks: [rank(0, { host: '<b onclick="x()">h</b>' })],
      owner: {
        kind: 'kernel',
        notebook: '<img src=x onerror=y>.ipynb',
        kernel_id: 'k',
        pid: 1,
        host: 'h'
      }
    });
    const div = document.createElement('div');
    div.innerHTML = meshHtml(m, NOW, '<u>note</u>');
    expect(div.querySelectorAll('img, script, b[onclick], i, u')).toHaveLength(0);
    const el = div.querySelector('.monarch-mesh') as HTMLElement;
    expect(el.dataset.mesh).toBe(hostile);
    expect(el.querySelector('b')?.textContent).toBe(hostile);
    expect(el.querySelector('.monarch-hosts')?.textContent).toContain('<script>x()</script>');
    expect(el.querySelector('.monarch-owner')?.textContent).toBe(
      'held by kernel of <img src=x onerror=y>.ipynb'
    );
  });
});

describe('the idle countdown', () => {
  it('counts down to the deadline in minutes and seconds', () => {
    expect(idleText(mesh({ idle_deadline: NOW + 252 }), NOW)).toBe(
      'stops in 4 min 12 s unless attached'
    );
    expect(idleText(mesh({ idle_deadline: NOW + 252 }), NOW + 1)).toBe(
      'stops in 4 min 11 s unless attached'
    );
    expect(idleText(mesh({ idle_deadline: NOW + 9.7 }), NOW)).toBe('stops in 9 s unless attached');
  });

  it('formats whole minutes and hours without zero parts', () => {
    expect(formatDuration(120)).toBe('2 min');
    expect(formatDuration(3600 + 180 + 5)).toBe('1 h 3 min');
    expect(formatDuration(7200)).toBe('2 h');
    expect(formatDuration(59.9)).toBe('59 s');
  });

  it('says the mesh is stopping once the deadline has passed', () => {
    expect(idleText(mesh({ idle_deadline: NOW - 3 }), NOW)).toBe(
      'stopping: idle with no controller'
    );
  });

  it('shows nothing while a controller is attached', () => {
    const owner = { kind: 'script' as const, notebook: null, kernel_id: null, pid: 7, host: 'h' };
    const m = mesh({ attached: true, owner, idle_deadline: null });
    expect(idleText(m, NOW)).toBe('');
    expect(rendered(m).querySelector('.monarch-idle')?.textContent).toBe('');
    // (attached wins over a deadline the server has yet to clear)
    expect(idleText(mesh({ attached: true, owner, idle_deadline: NOW + 60 }), NOW)).toBe('');
  });

  it('says "ephemeral" for a mesh that stops with its controller', () => {
    expect(idleText(mesh({ ephemeral: true, idle_deadline: null }), NOW)).toBe('ephemeral');
  });

  it('is in the mesh as of the time given', () => {
    const el = rendered(mesh({ idle_deadline: NOW + 65 }));
    expect(el.querySelector('.monarch-idle')?.textContent).toBe(
      'stops in 1 min 5 s unless attached'
    );
  });
});

describe('the owner', () => {
  it('names the notebook of a kernel, or the pid and host of a script', () => {
    expect(
      ownerText({
        kind: 'kernel',
        notebook: '/home/u/work/analysis.ipynb',
        kernel_id: 'k1',
        pid: 5,
        host: 'a'
      })
    ).toBe('held by kernel of analysis.ipynb');
    expect(
      ownerText({ kind: 'kernel', notebook: 'analysis.ipynb', kernel_id: 'k1', pid: 5, host: 'a' })
    ).toBe('held by kernel of analysis.ipynb');
    expect(
      ownerText({ kind: 'script', notebook: null, kernel_id: null, pid: 123, host: 'node3' })
    ).toBe('held by script pid 123 on node3');
    expect(
      ownerText({ kind: 'kernel', notebook: null, kernel_id: 'k1', pid: 9, host: 'node1' })
    ).toBe('held by kernel pid 9 on node1');
    expect(ownerText(null)).toBe('no controller');
  });
});

describe('the mesh header', () => {
  it('says how many procs are alive and the mesh state', () => {
    const m = mesh({
      state: 'degraded',
      alive: 1,
      unresponsive: 1,
      ranks: [rank(0), rank(1, { state: 'unresponsive' })]
    });
    const el = rendered(m);
    expect(el.textContent).toContain('1/2 procs alive, 1 unresponsive');
    const state = el.querySelector('.monarch-mesh-state') as HTMLElement;
    expect(state.dataset.state).toBe('degraded');
    expect(state.textContent).toBe('degraded');
    expect(el.querySelector('.monarch-owner')?.textContent).toBe('no controller');
  });
});

describe('a mesh unreachable from this server', () => {
  it('says so, with where it runs and what to do, and shows no ranks', () => {
    const why =
      "mesh 'train' cannot be reached from here: its host agent on login does not answer " +
      'this process. Use it from login, or end it there with `monarch-kernel down train`.';
    const m = mesh({
      state: 'unreachable',
      why,
      alive: 0,
      procs: 2,
      ranks: [],
      idle_deadline: null,
      hosts: [
        {
          host: 'login',
          addr: '127.0.0.1:5',
          procs: 2,
          alive: 0,
          state: 'unreachable',
          ranks: [0, 1]
        }
      ]
    });
    const el = rendered(m);
    const state = el.querySelector('.monarch-mesh-state') as HTMLElement;
    expect(state.dataset.state).toBe('unreachable');
    expect(el.querySelector('.monarch-hosts')?.textContent).toBe('hosts: login (unreachable, 0/2)');
    expect(el.querySelector('.monarch-why')?.textContent).toBe(why);
    expect(el.querySelectorAll('.monarch-rank')).toHaveLength(0);
  });

  it('has no such line while it answers', () => {
    expect(rendered(mesh({ why: null })).querySelector('.monarch-why')).toBeNull();
  });
});

describe('the status bar', () => {
  it('sums the procs of every mesh', () => {
    const a = mesh({ procs: 4, alive: 3 });
    const b = mesh({ name: 'eval', procs: 2, alive: 2 });
    expect(statusText([a, b])).toBe('meshes: 2, procs 5/6');
    expect(statusText([])).toBe('meshes: 0, procs 0/0');
  });
});

describe('the respawn button', () => {
  const button = (m: IMesh) =>
    rendered(m).querySelector('button[data-action="respawn"]') as HTMLButtonElement;

  it('is disabled when no rank is dead', () => {
    expect(button(mesh()).disabled).toBe(true);
    const m = mesh({ ranks: [rank(0, { state: 'unresponsive' }), rank(1, { state: 'lost' })] });
    expect(hasDeadRank(m)).toBe(false);
    expect(button(m).disabled).toBe(true);
  });

  it('is enabled when some rank is dead', () => {
    const m = mesh({ ranks: [rank(0), rank(1, { state: 'dead', why: 'SIGKILL' })] });
    expect(hasDeadRank(m)).toBe(true);
    expect(button(m).disabled).toBe(false);
  });

  it('sits beside the other actions', () => {
    const actions = [...rendered(mesh()).querySelectorAll('button')].map(b => b.dataset.action);
    expect(actions).toEqual(['attach', 'logs', 'stacks', 'respawn', 'down']);
  });
});

describe('notes', () => {
  it('say which ranks a respawn restarted', () => {
    expect(respawnNote({ mesh: 'train', ranks: [1], via: 'kernel' })).toBe('respawned ranks 1');
    expect(respawnNote({ mesh: 'train', ranks: [1, 3], via: 'administrator' })).toBe(
      'respawned ranks 1, 3'
    );
    expect(respawnNote({ mesh: 'train', ranks: [], via: 'administrator' })).toBe(
      'no dead ranks to respawn'
    );
  });

  it('say where a respawn runs while it runs', () => {
    expect(respawningNote(mesh({ attached: true }))).toContain('in the kernel that holds it');
    expect(respawningNote(mesh({ attached: false }))).toBe('respawning...');
  });

  it('show in their mesh, and only when there is one', () => {
    expect(rendered(mesh()).querySelector('.monarch-note')).toBeNull();
    const note = rendered(mesh(), 'respawned ranks 1').querySelector('.monarch-note');
    expect(note?.textContent).toBe('respawned ranks 1');
  });
});

describe('a large mesh', () => {
  /** `hosts` hosts of `per` ranks each; rank 5 dead, rank 9 unresponsive. */
  function large(hosts: number, per: number): IMesh {
    const ranks = [];
    for (let i = 0; i < hosts * per; i++) {
      const state = i === 5 ? 'dead' : i === 9 ? 'unresponsive' : 'alive';
      ranks.push(
        rank(i, { host: `h${Math.floor(i / per) + 1}`, state, why: i === 5 ? 'SIGKILL' : null })
      );
    }
    return mesh({
      procs: hosts * per,
      alive: hosts * per - 2,
      ranks,
      hosts: Array.from({ length: hosts }, (_, h) => ({
        host: `h${h + 1}`,
        addr: `10.0.0.${h + 1}:1`,
        procs: per,
        alive: per - (h === 0 ? 2 : 0),
        state: 'alive' as const,
        ranks: Array.from({ length: per }, (_, k) => h * per + k)
      }))
    });
  }

  it('shows a grid of ranks by host, not a row per rank', () => {
    const el = rendered(large(64, 16));
    expect(el.querySelector('table')).toBeNull();
    const hosts = el.querySelectorAll('.monarch-host');
    expect(hosts.length).toBe(64);
    expect(hosts[0].querySelectorAll('.monarch-cell').length).toBe(16);
    expect(el.querySelectorAll('.monarch-cell').length).toBe(1024);
    expect(hosts[0].querySelector('.monarch-host-summary')?.textContent).toBe(
      '14/16 alive · CPU 2% · 3200 MiB'
    );
    expect(el.querySelector('.monarch-hosts')?.textContent).toBe('64 hosts');
  });

  it('colours each cell by state and tells its details on hover and when clicked', () => {
    const m = large(4, 16);
    const el = rendered(m);
    const dead = el.querySelector('.monarch-cell[data-rank="5"]') as HTMLElement;
    expect(dead.dataset.state).toBe('dead');
    expect(dead.title).toBe('rank 5 · dead (SIGKILL) · pid 1005 · CPU 1.5% · 200 MiB');
    expect((el.querySelector('.monarch-cell[data-rank="9"]') as HTMLElement).dataset.state).toBe(
      'unresponsive'
    );
    expect(el.querySelector('.monarch-detail')).toBeNull();
    const div = document.createElement('div');
    div.innerHTML = meshHtml(m, NOW, '', 9);
    expect(div.querySelector('.monarch-detail')?.textContent).toBe(rankSummary(m.ranks[9]));
    expect(
      div.querySelector('.monarch-cell[data-rank="9"]')?.classList.contains('monarch-selected')
    ).toBe(true);
  });

  it('keeps the table below the threshold and uses JupyterLab toolbar buttons', () => {
    const el = rendered(large(2, (GRID_FROM - 1) / 2));
    expect(el.querySelector('table')).not.toBeNull();
    expect(el.querySelector('.monarch-grid')).toBeNull();
    const buttons = el.querySelectorAll('button');
    expect([...buttons].every(b => b.classList.contains('jp-ToolbarButtonComponent'))).toBe(true);
    expect((el.querySelector('button[data-action="respawn"]') as HTMLButtonElement).disabled).toBe(
      false
    );
  });
});
