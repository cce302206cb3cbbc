/**
 * Jest runs in native ESM mode: every @nestjs/* 12 package is ESM-only, which
 * the default CommonJS mode cannot load on Node 20, and transforming
 * node_modules does not help (`import.meta`). Hence ts-jest with `useESM`,
 * the `.js`-stripping mapper, tsconfig.test.json and
 * `NODE_OPTIONS=--experimental-vm-modules` (README.md, "Development").
 * Type-checking is `tsc --noEmit`, run by `npm run typecheck`.
 * @type {import('jest').Config}
 */
export default {
  testEnvironment: 'node',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform: {
    '^.+\\.ts$': ['ts-jest', { useESM: true, tsconfig: 'tsconfig.test.json', diagnostics: false }],
  },
  testMatch: ['<rootDir>/src/**/*.spec.ts', '<rootDir>/test/**/*.spec.ts', '<rootDir>/sample-app/**/*.spec.ts'],
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/test/reliability/'],
  globalSetup: '<rootDir>/test/support/global-setup.ts',
  globalTeardown: '<rootDir>/test/support/global-teardown.ts',
  // After the summary: the suites a missing message broker kept from running, and how to run them.
  reporters: ['default', '<rootDir>/test/support/not-run-reporter.js'],
  testTimeout: 60_000,
  maxWorkers: 2,
  // Native ESM mode keeps every spec file's module graph alive in its worker (8 MB a file for importing Nest
  // and the module alone, about 25 MB for an e2e file, measured after GC on Node 20), so a worker ended a
  // full run at over 1 GB, and on a loaded machine took longer than Jest's 500 ms to exit: "A worker process
  // has failed to exit gracefully", with no handle left open. Jest restarts a worker past this instead.
  workerIdleMemoryLimit: '512MB',
};
