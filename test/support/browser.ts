import { describe, it } from '@jest/globals';
import { accessSync, constants } from 'node:fs';
import { NOT_RUN_PREFIX } from './brokers.js';

/** Debian's Chromium (`apt-get install chromium`), or the browser `CHROMIUM_PATH` names. */
export const CHROMIUM_PATH = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

function chromiumInstalled(): boolean {
  try {
    accessSync(CHROMIUM_PATH, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** CI sets it (`.ci/run` installs Chromium): then a missing browser fails the run rather than leaving a suite out. */
function browserRequired(): boolean {
  const value = process.env.REQUIRE_BROWSER?.trim().toLowerCase();
  return value !== undefined && value !== '' && value !== '0' && value !== 'false';
}

/**
 * A suite that drives a real browser, as `describe.each(cases)` would run it.
 * Without Chromium, the suite is one passing test titled `not run: ...`,
 * which the end-of-run banner names with how to install it, as for a
 * missing message broker; with REQUIRE_BROWSER set, one failing test.
 */
export function describeEachWithBrowser<T extends string>(cases: readonly T[], name: string, body: (each: T) => void): void {
  if (chromiumInstalled()) {
    describe.each(cases)(name, body);
    return;
  }
  const why = `needs Chromium, which is not at ${CHROMIUM_PATH} (CHROMIUM_PATH; install it: apt-get install chromium)`;
  describe(name.replace('%s', cases.join(', ')), () => {
    it(browserRequired() ? why : `${NOT_RUN_PREFIX}${why}`, () => {
      if (browserRequired()) throw new Error(`REQUIRE_BROWSER is set: ${why}`);
    });
  });
}
