import { describe, expect, it } from '@jest/globals';
import { readFile } from 'node:fs/promises';

const read = (path: string) => readFile(new URL(`../${path}`, import.meta.url), 'utf8');
const NUMBERS = [
  'zero',
  'one',
  'two',
  'three',
  'four',
  'five',
  'six',
  'seven',
  'eight',
  'nine',
  'ten',
  'eleven',
  'twelve',
  'thirteen',
  'fourteen',
  'fifteen',
];

describe("docs/tsconfig.md says what package.json's exports and peers are", () => {
  it('names every public subpath, and counts them', async () => {
    const pkg = JSON.parse(await read('package.json')) as { exports: Record<string, unknown> };
    const doc = (await read('docs/tsconfig.md')).replace(/\s+/g, ' ');
    const subpaths = Object.keys(pkg.exports).filter((path) => path !== '.');
    const named = subpaths.filter(
      (path) => doc.includes(`\`${path.slice(1)}\``) || doc.includes(`\`nest-idempotency-pg${path.slice(1)}\``),
    );
    expect(named).toEqual(subpaths);
    expect(doc).toContain(`These ${NUMBERS[subpaths.length]} subpaths and the root are the package's \`exports\``);
  });

  it('counts the optional peers as peerDependenciesMeta lists them', async () => {
    const pkg = JSON.parse(await read('package.json')) as { peerDependenciesMeta: Record<string, { optional?: boolean }> };
    const optional = Object.values(pkg.peerDependenciesMeta).filter((meta) => meta.optional).length;
    expect((await read('docs/tsconfig.md')).replace(/\s+/g, ' ')).toContain(
      `**Optional peers** (${NUMBERS[optional]}, listed in`,
    );
  });
});
