import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { readdir, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { send } from '../support/http.js';
import { Fleet } from './support/sample-process.js';
import { ScenarioDatabase } from './support/scenario-database.js';

const REPOSITORY_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** What `npm run sample` runs. */
const START_SCRIPT = join(REPOSITORY_ROOT, 'sample-app', 'start.mjs');

/**
 * Issue 10: of three `npm run sample` started together, one crashed reading a
 * module another one's tsc was still writing into `dist-sample` ("does not
 * provide an export named 'TransactionHost'"). Three starts at once with a
 * cold build (a build directory of their own, so none is reused), each
 * against the same empty database: all must build and boot.
 */
describe('three npm run sample started at once', () => {
  const fleet = new Fleet();
  // Inside the repository, where Node finds package.json and node_modules; new, so all three compile.
  const buildDir = join('dist-sample', `.start-race-${process.pid}-${Date.now()}`);
  let db: ScenarioDatabase;

  beforeAll(async () => {
    db = await ScenarioDatabase.create('sample_start');
  });
  afterAll(async () => {
    await fleet.stopAll();
    await db?.drop();
    await rm(join(REPOSITORY_ROOT, buildDir), { recursive: true, force: true });
  });

  it('all three build and answer /health; one build is left, no staging directory', () =>
    fleet.explain(async () => {
      const started = await fleet.startAll(
        (['express', 'fastify', 'express'] as const).map((adapter, i) => ({
          name: `npm-run-sample-${i + 1}`,
          adapter,
          databaseUrl: db.url,
          entry: START_SCRIPT,
          // Three tsc runs at once on a small machine, before the app starts.
          healthTimeoutMs: 180_000,
          env: { SAMPLE_BUILD_DIR: buildDir },
        })),
      );
      expect(started).toHaveLength(3);
      for (const sample of started) {
        expect(sample.alive).toBe(true);
        expect((await send(sample.url, 'GET', '/health')).status).toBe(200);
      }
      const builds = await readdir(join(REPOSITORY_ROOT, buildDir));
      expect(builds).toHaveLength(1);
      expect(builds[0]).toMatch(/^[0-9a-f]{16}$/);
    }));
});
