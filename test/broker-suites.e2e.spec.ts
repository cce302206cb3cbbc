import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { databaseUrl } from './support/database.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const BROKER_SPEC = 'test/messages-rabbitmq.e2e.spec.ts';
const BROWSER_SPEC = 'sample-app/board.browser.spec.ts';

/** A loopback port nothing listens on: bound, then released. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** `npm test -- <spec>` as a process of its own, with the brokers pointed at a closed port. */
async function runJest(
  env: Record<string, string | undefined>,
  spec = BROKER_SPEC,
): Promise<{ code: number | null; output: string }> {
  const port = await closedPort();
  const childEnv: Record<string, string | undefined> = {
    ...process.env,
    NODE_OPTIONS: '--experimental-vm-modules',
    // The outer run's database, so the inner one starts none; and none of the outer run's findings or flags.
    DATABASE_URL: databaseUrl(),
    RABBITMQ_URL: `amqp://guest:guest@127.0.0.1:${port}`,
    NATS_URL: `127.0.0.1:${port}`,
    REQUIRE_BROKERS: undefined,
    REQUIRE_BROWSER: undefined,
    IDEMPOTENCY_TEST_BROKERS: undefined,
    JEST_WORKER_ID: undefined,
    ...env,
  };
  for (const [name, value] of Object.entries(childEnv)) if (value === undefined) delete childEnv[name];
  const child = spawn(process.execPath, [join(ROOT, 'node_modules/jest/bin/jest.js'), '--runTestsByPath', spec], {
    cwd: ROOT,
    env: childEnv as NodeJS.ProcessEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  return { code, output };
}

/**
 * `npm test` on a machine without the brokers: the suites that need one are
 * not run, the run passes and says so loudly at its end; with REQUIRE_BROKERS
 * (set in .ci/run) the same run fails, so CI can never pass without them.
 */
describe('suites that need a message broker', () => {
  it('are not run where the broker does not answer: the run passes, and its last words name them and how to run them', async () => {
    const { code, output } = await runJest({});
    expect({ code, output }).toEqual({ code: 0, output: expect.any(String) });
    // Only the stand-in ran, none of the suite's own tests.
    expect(output).toMatch(/Tests:\s+1 skipped, 1 total/);
    const banner = output.slice(output.lastIndexOf('Ran all test suites'));
    // It names what is missing (the broker, not a browser) and that the stand-in is not counted as passed.
    expect(banner).toContain('NOT RUN: 1 suite, because RabbitMQ did not answer.');
    expect(banner).toContain('Counted as skipped in the summary above, not as passed.');
    expect(banner).not.toContain('Chromium');
    expect(banner).toContain(`${BROKER_SPEC} › idempotent message handlers on RabbitMQ`);
    expect(banner).toContain('Needs RabbitMQ, which did not answer at amqp://guest:***@127.0.0.1:');
    expect(banner).toContain(`npm test -- ${BROKER_SPEC}`);
  });

  it('fail the run before any test where the broker does not answer and REQUIRE_BROKERS is set', async () => {
    const { code, output } = await runJest({ REQUIRE_BROKERS: '1' });
    expect(code).not.toBe(0);
    expect(output).toContain('REQUIRE_BROKERS is set, and these brokers did not answer:');
    expect(output).toContain('RabbitMQ at amqp://guest:***@127.0.0.1:');
    expect(output).not.toMatch(/Tests:\s+\d+ passed/);
  });
});

/** The same for the operator board's browser suite where Chromium is not installed (REQUIRE_BROWSER, set in .ci/run). */
describe('the suite that needs a browser', () => {
  it('is not run where Chromium is missing: the run passes, and its last words say how to install it', async () => {
    const { code, output } = await runJest({ CHROMIUM_PATH: '/nonexistent/chromium' }, BROWSER_SPEC);
    expect({ code, output }).toEqual({ code: 0, output: expect.any(String) });
    expect(output).toMatch(/Tests:\s+1 skipped, 1 total/);
    const banner = output.slice(output.lastIndexOf('Ran all test suites'));
    expect(banner).toContain(`${BROWSER_SPEC} › the operator board in Chromium`);
    expect(banner).toContain('Needs Chromium, which is not at /nonexistent/chromium');
  });

  it('fails where Chromium is missing and REQUIRE_BROWSER is set', async () => {
    const { code, output } = await runJest({ CHROMIUM_PATH: '/nonexistent/chromium', REQUIRE_BROWSER: '1' }, BROWSER_SPEC);
    expect(code).not.toBe(0);
    expect(output).toContain('REQUIRE_BROWSER is set: needs Chromium');
    expect(output).toMatch(/Tests:\s+1 failed, 1 total/);
  });
});
