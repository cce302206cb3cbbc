import { describe, expect, it } from '@jest/globals';
import { readdir, readFile, stat } from 'node:fs/promises';
import { posix } from 'node:path';

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
  'sixteen',
  'seventeen',
  'eighteen',
  'nineteen',
  'twenty',
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

describe('the README is a front page', () => {
  it('warns in the Quick start that a 4xx the handler throws is replayed, and shows the switch to Fastify', async () => {
    const readme = await read('README.md');
    const quickStart = readme.slice(
      readme.indexOf('\n## Quick start'),
      readme.indexOf('\n## ', readme.indexOf('\n## Quick start') + 1),
    );
    expect(quickStart).toContain('**A 4xx your handler throws is its answer, and is replayed.**');
    expect(quickStart).toMatch(/a corrected body under it is a 422/);
    expect(quickStart).toContain('new FastifyAdapter()');
  });

  it('stays under 400 lines, the rest in the guides', async () => {
    expect((await read('README.md')).split('\n').length).toBeLessThan(400);
  });

  it("links only to files that exist, and to headings that exist in this repository's Markdown", async () => {
    const files = [
      'README.md',
      ...(await readdir(new URL('../docs/', import.meta.url)))
        .filter((name) => name.endsWith('.md'))
        .map((name) => `docs/${name}`),
    ];
    const anchorsOf = (markdown: string) =>
      new Set(
        [...markdown.matchAll(/^#+ (.+)$/gm), ...markdown.matchAll(/<a id="([^"]+)"><\/a>/g)].map((m) =>
          m[0].startsWith('<a')
            ? m[1]
            : m[1]
                .toLowerCase()
                .replace(/[^\p{L}\p{N} -]/gu, '')
                .replace(/ /g, '-'),
        ),
      );
    const broken: string[] = [];
    for (const file of files) {
      const text = await read(file);
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target)) continue;
        const [path, anchor] = target.split('#');
        const resolved = path === '' ? file : posix.normalize(posix.join(posix.dirname(file), path));
        // A file or a folder (GitHub shows a folder's listing).
        const exists = await stat(new URL(`../${resolved}`, import.meta.url)).then(
          () => true,
          () => false,
        );
        if (!exists) broken.push(`${file} → ${target}`);
        else if (anchor && resolved.endsWith('.md') && !anchorsOf(await read(resolved)).has(anchor))
          broken.push(`${file} → ${target}`);
      }
    }
    expect(broken).toEqual([]);
  });
});
