/** test/support/not-run-reporter.js leaves its banner here; printed last, after Jest's summary. */
const NOT_RUN_BANNER = Symbol.for('nest-idempotency-pg.test.not-run-banner');

export default async function globalTeardown(): Promise<void> {
  try {
    await globalThis.__EMBEDDED_DB__?.stop();
  } finally {
    const banner = (globalThis as Record<symbol, unknown>)[NOT_RUN_BANNER];
    if (typeof banner === 'string') process.stderr.write(banner);
  }
}
