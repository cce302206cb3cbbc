// A Jest reporter that names the suites that did not run because a message
// broker or the Citus cluster did not answer or Chromium is not installed, and says how to run them. Each such suite is one test
// titled `not run: needs <what>, which ...` (describeWithBroker in brokers.ts, describeEachWithBrowser in
// browser.ts, describeWithCitus in citus.ts), which passes, so `npm test` passes on a machine without them. The reporter counts those tests
// (and a file that holds nothing else) as skipped, not passed, in Jest's summary, and its banner makes sure
// nobody takes them for suites that passed. Jest prints its summary after every reporter, so the banner is left
// for the global teardown, which runs after the summary, to print as the run's last words. Plain JavaScript:
// Jest loads reporters as they are (types in not-run-reporter.d.ts, for its spec).
import { relative } from 'node:path';

/** NOT_RUN_PREFIX in brokers.ts. */
const NOT_RUN_PREFIX = 'not run: ';
/** What describeEachWithBrowser says is missing. */
const BROWSER = 'Chromium';
/** What describeWithCitus says is missing; anything else a stand-in names is a message broker. */
const CITUS = 'Citus';

/** Where the banner waits for test/support/global-teardown.ts (same process). */
export const NOT_RUN_BANNER = Symbol.for('nest-idempotency-pg.test.not-run-banner');

/** The stand-in tests of one file's results that passed (with REQUIRE_BROKERS or REQUIRE_BROWSER set, none do). */
function passedStandIns(fileResult) {
  return fileResult.testResults.filter((test) => test.status === 'passed' && test.title.startsWith(NOT_RUN_PREFIX));
}

/** What a stand-in's reason says is missing: `RabbitMQ`, `NATS JetStream`, `Chromium`. */
function missingOf(why) {
  return /^needs (.+?), which/.exec(why)?.[1] ?? why;
}

/** `a`, `a and b`, `a, b and c`. */
function list(names) {
  return names.length < 2 ? names.join('') : `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

/**
 * Jest's totals, with the passed stand-ins of `fileResult` moved from passed to skipped (and the file too when
 * they are all it holds). Called as each file's result is added; the summary is printed from these totals.
 */
export function countApart(fileResult, aggregated) {
  const standIns = passedStandIns(fileResult).length;
  if (standIns === 0) return;
  aggregated.numPassedTests -= standIns;
  aggregated.numPendingTests += standIns;
  if (standIns === fileResult.testResults.length && !fileResult.testExecError) {
    aggregated.numPassedTestSuites -= 1;
    aggregated.numPendingTestSuites += 1;
  }
}

/** The end-of-run banner for `results` (Jest's aggregated results), or undefined when every suite ran. */
export function notRunBanner(results, rootDir) {
  const notRun = [];
  for (const file of results.testResults) {
    for (const test of file.testResults) {
      if (!test.title.startsWith(NOT_RUN_PREFIX)) continue;
      const why = test.title.slice(NOT_RUN_PREFIX.length);
      notRun.push({
        file: relative(rootDir, file.testFilePath),
        suite: test.ancestorTitles.join(' › '),
        why,
        missing: missingOf(why),
      });
    }
  }
  if (notRun.length === 0) return undefined;

  const files = [...new Set(notRun.map((entry) => entry.file))];
  const reasons = [...new Set(notRun.map((entry) => entry.why))];
  const missing = [...new Set(notRun.map((entry) => entry.missing))];
  const brokers = missing.filter((name) => name !== BROWSER && name !== CITUS);
  const browser = missing.includes(BROWSER);
  const citus = missing.includes(CITUS);
  const answering = [...brokers, ...(citus ? [CITUS] : [])];
  const what = [
    answering.length > 0 ? `${list(answering)} did not answer` : undefined,
    browser ? `${BROWSER} is not installed` : undefined,
  ].filter(Boolean);
  const until = [
    answering.length > 0 ? `${list(answering)} ${answering.length > 1 ? 'answer' : 'answers'}` : undefined,
    browser ? `${BROWSER} is installed` : undefined,
  ].filter(Boolean);
  const required = [
    brokers.length > 0 ? 'REQUIRE_BROKERS=1' : undefined,
    browser ? 'REQUIRE_BROWSER=1' : undefined,
    citus ? 'REQUIRE_CITUS=1' : undefined,
  ].filter(Boolean);
  const kinds = [
    brokers.length > 0 ? 'broker' : undefined,
    browser ? 'browser' : undefined,
    citus ? 'Citus cluster' : undefined,
  ].filter(Boolean);
  const rule = '!'.repeat(78);
  const suites = notRun.length === 1 ? '1 suite' : `${notRun.length} suites`;
  return [
    '',
    rule,
    `!! NOT RUN: ${suites}, because ${what.join(' and ')}.`,
    '!! Counted as skipped in the summary above, not as passed. The rest of the run passed or failed on its own;',
    '!! these were not run at all:',
    '!!',
    ...notRun.map((entry) => `!!   ${entry.file} › ${entry.suite} (needs ${entry.missing})`),
    '!!',
    ...reasons.map((why) => `!! ${why[0].toUpperCase()}${why.slice(1)}.`),
    '!!',
    `!! Run them once ${until.join(' and ')}:`,
    `!!   npm test -- ${files.join(' ')}`,
    `!! ${required.join(' and ')} (as CI sets ${required.length > 1 ? 'them' : 'it'}) ${required.length > 1 ? 'make' : 'makes'} ` +
      `a missing ${kinds.join(' or ')} fail the run instead.`,
    rule,
    '',
  ].join('\n');
}

export default class NotRunReporter {
  constructor(globalConfig) {
    this.rootDir = globalConfig.rootDir;
  }

  onTestFileResult(_test, fileResult, aggregated) {
    countApart(fileResult, aggregated);
  }

  onRunComplete(_testContexts, results) {
    const text = notRunBanner(results, this.rootDir);
    if (text === undefined) return;
    globalThis[NOT_RUN_BANNER] = process.stderr.isTTY ? `\u001b[1;33m${text}\u001b[0m\n` : `${text}\n`;
  }
}
