import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { appendFile, mkdir, mkdtemp, readdir, readFile, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { buildSampleApp } from './build.mjs';

const FIRST_HALF = 'export const ready = ';
const SECOND_HALF = 'true;\n';
const COMPLETE = FIRST_HALF + SECOND_HALF;
const DAY_MS = 24 * 60 * 60 * 1000;

/**
 * `npm run sample` builds with sample-app/build.mjs. Several instances
 * started at once used to compile into one directory, and one of them
 * crashed importing a module another's tsc was rewriting. These pin the
 * mechanism that prevents it, with stand-ins for tsc that write main.js in
 * two halves (the reliability suite boots three real `npm run sample` at once).
 */
describe('the sample app build (sample-app/build.mjs)', () => {
  let outDir: string;
  beforeEach(async () => {
    outDir = await mkdtemp(join(tmpdir(), 'sample-build-'));
  });
  afterEach(async () => {
    await rm(outDir, { recursive: true, force: true });
  });

  /** Writes `sample-app/main.js` in two halves with a pause between, as a slow tsc might. */
  function slowCompiler(calls: string[]) {
    return async (stagingDir: string) => {
      calls.push(stagingDir);
      await mkdir(join(stagingDir, 'sample-app'), { recursive: true });
      const main = join(stagingDir, 'sample-app', 'main.js');
      await writeFile(main, FIRST_HALF);
      await sleep(300);
      await appendFile(main, SECOND_HALF);
    };
  }

  it('three builds started at once: each compiles privately, one lands, all get the same complete main.js, and nobody ever reads half of it', async () => {
    // Each stand-in for tsc writes the first half of main.js, then waits for the test to let it write the
    // second: the test, not the scheduler, decides when each build gets on, and looks at every step.
    const calls: string[] = [];
    const releases: Array<() => void> = [];
    let allHalfWritten!: () => void;
    const halfWritten = new Promise<void>((resolve) => (allHalfWritten = resolve));
    const gatedCompiler = async (stagingDir: string) => {
      calls.push(stagingDir);
      await mkdir(join(stagingDir, 'sample-app'), { recursive: true });
      const main = join(stagingDir, 'sample-app', 'main.js');
      await writeFile(main, FIRST_HALF);
      const released = new Promise<void>((resolve) => releases.push(resolve));
      if (releases.length === 3) allHalfWritten();
      await released;
      await appendFile(main, SECOND_HALF);
    };
    /** What an instance starting now would read: every build's main.js (staging directories are nobody's). */
    const readAsAStartingInstance = async () => {
      const found: string[] = [];
      for (const name of await readdir(outDir)) {
        if (name.startsWith('.staging-')) continue;
        const content = await readFile(join(outDir, name, 'sample-app', 'main.js'), 'utf8').catch(() => undefined);
        found.push(content ?? `${name} without main.js`);
      }
      return found;
    };
    const stagedHalves = async () => {
      const names = (await readdir(outDir)).filter((name) => name.startsWith('.staging-'));
      return Promise.all(names.map((name) => readFile(join(outDir, name, 'sample-app', 'main.js'), 'utf8')));
    };

    const builds = [1, 2, 3].map(() => buildSampleApp({ outDir, compile: gatedCompiler }));
    await halfWritten;
    // Three half-written main.js, each in its own staging directory; nothing an instance could start from.
    expect(await stagedHalves()).toEqual([FIRST_HALF, FIRST_HALF, FIRST_HALF]);
    expect(await readAsAStartingInstance()).toEqual([]);

    releases[0]();
    const first = await Promise.race(builds);
    expect(first.compiled).toBe(true);
    // One build landed, complete, while the two others are still half-written in staging.
    expect(await readAsAStartingInstance()).toEqual([COMPLETE]);
    expect(await stagedHalves()).toEqual([FIRST_HALF, FIRST_HALF]);

    releases[1]();
    releases[2]();
    const all = await Promise.all(builds);
    expect(await readAsAStartingInstance()).toEqual([COMPLETE]);
    expect(calls).toHaveLength(3);
    expect(new Set(calls).size).toBe(3);
    expect(new Set(all.map((build) => build.main))).toEqual(new Set([first.main]));
    expect(all.filter((build) => build.compiled)).toHaveLength(1);
    expect(await readFile(first.main, 'utf8')).toBe(COMPLETE);
    // Only the build is left: every staging directory was removed.
    expect(await readdir(outDir)).toEqual([basename(first.buildDir)]);
  });

  it('reuses a build of the same inputs without compiling', async () => {
    const calls: string[] = [];
    const first = await buildSampleApp({ outDir, compile: slowCompiler(calls) });
    const second = await buildSampleApp({ outDir, compile: slowCompiler(calls) });
    expect(calls).toHaveLength(1);
    expect(second).toEqual({ ...first, compiled: false });
    expect(basename(first.buildDir)).toMatch(/^[0-9a-f]{16}$/);
  });

  it('a failed compile leaves neither a build nor a staging directory, and says why', async () => {
    await expect(
      buildSampleApp({
        outDir,
        compile: async (stagingDir) => {
          await writeFile(join(stagingDir, 'half.js'), FIRST_HALF);
          throw new Error('tsc: error TS2322');
        },
      }),
    ).rejects.toThrow('tsc: error TS2322');
    expect(await readdir(outDir)).toEqual([]);
  });

  it('prunes builds unused for a day and staging directories abandoned for an hour, never the build in use', async () => {
    const age = async (name: string, ms: number) => {
      await mkdir(join(outDir, name), { recursive: true });
      const then = new Date(Date.now() - ms);
      await utimes(join(outDir, name), then, then);
    };
    await age('0123456789abcdef', 2 * DAY_MS);
    await age('fedcba9876543210', 60_000);
    await age('.staging-abandoned', 2 * 60 * 60 * 1000);
    await age('.staging-running', 60_000);
    await age('not-a-build', 2 * DAY_MS);

    const { buildDir } = await buildSampleApp({ outDir, compile: slowCompiler([]) });
    expect((await readdir(outDir)).sort()).toEqual(
      [basename(buildDir), 'fedcba9876543210', '.staging-running', 'not-a-build'].sort(),
    );

    // The build in use is old too, but starting it marks it used, so it stays.
    await age(basename(buildDir), 2 * DAY_MS);
    const again = await buildSampleApp({ outDir, compile: slowCompiler([]) });
    expect(again).toMatchObject({ buildDir, compiled: false });
    expect(Date.now() - (await stat(buildDir)).mtimeMs).toBeLessThan(DAY_MS);
  });
});
