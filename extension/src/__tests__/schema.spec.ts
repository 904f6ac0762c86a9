/**
 * The panel's fixtures (IMesh, as render.spec.ts uses them) are what the server sends:
 * valid against the one schema of the JSON (schema/mesh-view.schema.json), which the
 * Python tests check real views against. A field the panel reads that the server does
 * not send, or the other way round, fails here or there.
 */
import Ajv2020 from 'ajv/dist/2020';
import { NOW, mesh, rank } from './fixtures';
import { IMesh } from '../render';
import schema from '../../schema/mesh-view.schema.json';

const validate = new Ajv2020({ allErrors: true, strict: true }).compile(schema);

function errors(m: IMesh): string {
  return validate(m) ? '' : JSON.stringify(validate.errors, null, 1);
}

describe('the mesh view schema', () => {
  it('accepts every shape of mesh the panel is tested with', () => {
    const shapes: IMesh[] = [
      mesh(),
      mesh({
        state: 'degraded',
        alive: 1,
        ranks: [rank(0), rank(1, { state: 'dead', why: 'SIGKILL', usage: null })]
      }),
      mesh({
        attached: true,
        idle_deadline: null,
        owner: { kind: 'kernel', notebook: 'train.ipynb', kernel_id: 'k1', pid: 7, host: 'login' }
      }),
      mesh({
        ranks: [
          rank(0, { usage: { cpu: 3, rss: 1, gpu: 50, gpu_mem: 2, tensors: 64, tensor_refs: 2 } })
        ]
      }),
      mesh({
        state: 'unreachable',
        why: 'it runs on another host',
        ranks: [],
        alive: 0,
        created: NOW
      })
    ];
    for (const m of shapes) {
      expect(errors(m)).toBe('');
    }
  });

  it('refuses a field it does not know, a missing one and a state it does not name', () => {
    expect(validate({ ...mesh(), extra: 1 })).toBe(false);
    const { ranks: _ranks, ...without } = mesh();
    expect(validate(without)).toBe(false);
    expect(validate(mesh({ ranks: [{ ...rank(0), state: 'sleepy' as 'alive' }] }))).toBe(false);
  });
});
