// A Jest reporter that names the suites that did not run because a message
// broker did not answer (or Chromium is not installed), and says how to run them. Each such suite is one test
// titled `not run: ...` (describeWithBroker in brokers.ts), which passes, so
// `npm test` passes on a machine without brokers; the banner makes sure nobody
// takes that for the broker suites passing. Jest prints its summary after every
// reporter, so the banner is left for the global teardown, which runs after the
// summary, to print as the run's last words. Plain JavaScript: Jest loads
// reporters as they are.
import { relative } from 'node:path';

/** NOT_RUN_PREFIX in brokers.ts. */
const NOT_RUN_PREFIX = 'not run: ';

/** Where the banner waits for test/support/global-teardown.ts (same process). */
export const NOT_RUN_BANNER = Symbol.for('nest-idempotency-pg.test.not-run-banner');

export default class NotRunReporter {
  constructor(globalConfig) {
    this.rootDir = globalConfig.rootDir;
  }

  onRunComplete(_testContexts, results) {
    const notRun = [];
    for (const file of results.testResults) {
      for (const test of file.testResults) {
        if (!test.title.startsWith(NOT_RUN_PREFIX)) continue;
        notRun.push({
          file: relative(this.rootDir, file.testFilePath),
          suite: test.ancestorTitles.join(' › '),
          why: test.title.slice(NOT_RUN_PREFIX.length),
        });
      }
    }
    if (notRun.length === 0) return;

    const files = [...new Set(notRun.map((entry) => entry.file))];
    const reasons = [...new Set(notRun.map((entry) => entry.why))];
    const rule = '!'.repeat(78);
    const lines = [
      '',
      rule,
      `!! NOT RUN: ${notRun.length} suite(s) need a message broker that did not answer, or a browser that is not installed.`,
      '!! The rest of the run passed or failed on its own; these were not run at all:',
      '!!',
      ...notRun.map((entry) => `!!   ${entry.file} › ${entry.suite}`),
      '!!',
      ...reasons.map((why) => `!! ${why[0].toUpperCase()}${why.slice(1)}.`),
      '!!',
      '!! Run them once the brokers are up (the browser installed):',
      `!!   npm test -- ${files.join(' ')}`,
      '!! REQUIRE_BROKERS=1 and REQUIRE_BROWSER=1 (as CI sets them) make a missing broker or browser fail the run instead.',
      rule,
      '',
    ];
    const text = lines.join('\n');
    globalThis[NOT_RUN_BANNER] = process.stderr.isTTY ? `\u001b[1;33m${text}\u001b[0m\n` : `${text}\n`;
  }
}
