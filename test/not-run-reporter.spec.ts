import { describe, expect, it } from '@jest/globals';
import { countApart, notRunBanner, type FileResult, type TestCaseResult } from './support/not-run-reporter.js';

const ROOT = '/repo';
const RABBITMQ =
  'not run: needs RabbitMQ, which did not answer at amqp://127.0.0.1:5672 (RABBITMQ_URL; start one: rabbitmq-server -detached)';
const NATS =
  'not run: needs NATS JetStream, which did not answer at nats://127.0.0.1:4222 (NATS_URL; start one: nats-server -js)';
const CHROMIUM =
  'not run: needs Chromium, which is not at /usr/bin/chromium (CHROMIUM_PATH; install it: apt-get install chromium)';

const CITUS =
  'not run: needs Citus, which did not answer at postgres://postgres@127.0.0.1:9700/postgres (it did not answer; CITUS_URL; start one: ../shared/citus/cluster.sh start)';

const test = (title: string, status: TestCaseResult['status'] = 'passed'): TestCaseResult => ({
  title,
  ancestorTitles: ['a suite'],
  status,
});
const file = (path: string, ...tests: TestCaseResult[]): FileResult => ({ testFilePath: `${ROOT}/${path}`, testResults: tests });
const totals = () => ({ numPassedTests: 10, numPendingTests: 0, numPassedTestSuites: 3, numPendingTestSuites: 0 });

describe('the not-run reporter (test/support/not-run-reporter.js)', () => {
  it('counts a file that holds only a stand-in as a skipped suite and its test as skipped, not as passed', () => {
    const aggregated = totals();
    countApart(file('sample-app/board.browser.spec.ts', test(CHROMIUM)), aggregated);
    expect(aggregated).toEqual({ numPassedTests: 9, numPendingTests: 1, numPassedTestSuites: 2, numPendingTestSuites: 1 });
  });

  it('counts the stand-ins of a file that also ran tests as skipped, and the file as the passed suite it is', () => {
    const aggregated = totals();
    countApart(file('sample-app/refunds.e2e.spec.ts', test('refunds once'), test(RABBITMQ), test(NATS)), aggregated);
    expect(aggregated).toEqual({ numPassedTests: 8, numPendingTests: 2, numPassedTestSuites: 3, numPendingTestSuites: 0 });
  });

  it('leaves a failed stand-in (the broker answers now) and ordinary tests alone', () => {
    const aggregated = totals();
    countApart(file('test/x.spec.ts', test(RABBITMQ, 'failed'), test('ordinary')), aggregated);
    expect(aggregated).toEqual(totals());
  });

  it('says nothing when every suite ran', () => {
    expect(notRunBanner({ testResults: [file('test/x.spec.ts', test('ordinary'))] }, ROOT)).toBeUndefined();
  });

  it('names the browser, and no broker, when only Chromium is missing', () => {
    const banner = notRunBanner({ testResults: [file('sample-app/board.browser.spec.ts', test(CHROMIUM))] }, ROOT)!;
    expect(banner).toContain('NOT RUN: 1 suite, because Chromium is not installed.');
    expect(banner).toContain('Counted as skipped in the summary above, not as passed.');
    expect(banner).toContain('sample-app/board.browser.spec.ts › a suite (needs Chromium)');
    expect(banner).toContain('Run them once Chromium is installed:');
    expect(banner).toContain('npm test -- sample-app/board.browser.spec.ts');
    expect(banner).toContain('REQUIRE_BROWSER=1 (as CI sets it) makes a missing browser fail the run instead.');
    expect(banner).not.toMatch(/broker/i);
  });

  it('names the brokers that did not answer, and no browser, when only brokers are missing', () => {
    const banner = notRunBanner({ testResults: [file('sample-app/refunds.e2e.spec.ts', test(RABBITMQ), test(NATS))] }, ROOT)!;
    expect(banner).toContain('NOT RUN: 2 suites, because RabbitMQ and NATS JetStream did not answer.');
    expect(banner).toContain('Run them once RabbitMQ and NATS JetStream answer:');
    expect(banner).toContain('REQUIRE_BROKERS=1 (as CI sets it) makes a missing broker fail the run instead.');
    expect(banner).not.toMatch(/browser|chromium/i);
  });

  it('names both when both are missing', () => {
    const banner = notRunBanner(
      { testResults: [file('test/a.spec.ts', test(NATS)), file('sample-app/board.browser.spec.ts', test(CHROMIUM))] },
      ROOT,
    )!;
    expect(banner).toContain('NOT RUN: 2 suites, because NATS JetStream did not answer and Chromium is not installed.');
    expect(banner).toContain('Run them once NATS JetStream answers and Chromium is installed:');
    expect(banner).toContain('npm test -- test/a.spec.ts sample-app/board.browser.spec.ts');
    expect(banner).toContain('REQUIRE_BROKERS=1 and REQUIRE_BROWSER=1 (as CI sets them) make a missing broker or browser fail');
  });

  it('names the Citus cluster, its variable and REQUIRE_CITUS, and no broker or browser, when only Citus is missing', () => {
    const banner = notRunBanner({ testResults: [file('test/citus.e2e.spec.ts', test(CITUS))] }, ROOT)!;
    expect(banner).toContain('NOT RUN: 1 suite, because Citus did not answer.');
    expect(banner).toContain('test/citus.e2e.spec.ts › a suite (needs Citus)');
    expect(banner).toContain('Run them once Citus answers:');
    expect(banner).toContain('npm test -- test/citus.e2e.spec.ts');
    expect(banner).toContain('REQUIRE_CITUS=1 (as CI sets it) makes a missing Citus cluster fail the run instead.');
    expect(banner).not.toMatch(/broker|browser|chromium|REQUIRE_BROKERS/i);
  });

  it('counts a Citus stand-in as skipped, not passed', () => {
    const aggregated = totals();
    countApart(file('test/citus.e2e.spec.ts', test(CITUS)), aggregated);
    expect(aggregated).toEqual({ numPassedTests: 9, numPendingTests: 1, numPassedTestSuites: 2, numPendingTestSuites: 1 });
  });
});
