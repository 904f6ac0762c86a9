/**
 * The panel's test data: a mesh as the server sends it (IMesh), checked against the
 * one schema of that JSON by schema.spec.ts.
 */
import { IMesh, IRank } from '../render';

export const NOW = 1_700_000_000;

export function rank(r: number, extra: Partial<IRank> = {}): IRank {
  return {
    rank: r,
    pid: 1000 + r,
    host: 'node0',
    state: 'alive',
    why: null,
    restarts: 0,
    usage: { cpu: 1.5, rss: 200 * 2 ** 20 },
    ...extra
  };
}

export function mesh(extra: Partial<IMesh> = {}): IMesh {
  const ranks = extra.ranks ?? [rank(0), rank(1)];
  return {
    name: 'train',
    state: 'alive',
    why: null,
    procs: ranks.length,
    alive: ranks.filter(r => r.state === 'alive').length,
    unresponsive: 0,
    hosts: [
      {
        host: 'node0',
        addr: '10.0.0.1',
        procs: ranks.length,
        alive: 2,
        state: 'alive',
        ranks: ranks.map(r => r.rank)
      }
    ],
    epoch: 3,
    attached: false,
    owner: null,
    ephemeral: false,
    idle_timeout: 600,
    idle_deadline: NOW + 600,
    created: NOW - 60,
    ranks,
    ...extra
  };
}
