import base from './jest.config.js';

/**
 * The reliability suite (`npm run test:reliability`): real processes, crashes,
 * database faults and property-based tests. Slower than the default run, so
 * it has its own script; CI runs both. One worker: the scenarios kill and
 * restart processes and measure effects, and must not compete for the CPU.
 * @type {import('jest').Config}
 */
export default {
  ...base,
  testMatch: ['<rootDir>/test/reliability/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  // The default setup (a database), then one compilation of the sample app the scenarios start as processes.
  globalSetup: '<rootDir>/test/reliability/support/global-setup.ts',
  testTimeout: 300_000,
  maxWorkers: 1,
  // In band, as before: the scenarios are few and long, and a memory limit would move them into a worker.
  workerIdleMemoryLimit: undefined,
};
