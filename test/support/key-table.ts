import { randomUUID } from 'node:crypto';
import type { ClaimRequest } from '../../src/store/index.js';

/**
 * Which key table a spec file runs against. The plain table by default; a
 * spec file that calls `useKeyTable('partitioned')` before importing the
 * shared suites (test/partitioned-table.e2e.spec.ts) runs them against the
 * partitioned table instead. Jest gives every spec file a module registry of
 * its own, so the choice never leaks into another file.
 */
export type KeyTableKind = 'plain' | 'partitioned';

let kind: KeyTableKind = 'plain';

export function useKeyTable(table: KeyTableKind): void {
  kind = table;
}

export function keyTableKind(): KeyTableKind {
  return kind;
}

/** The module and store options that go with the key table in use. */
export function keyTableOptions(): { partitioned?: boolean; citus?: boolean } {
  // The cluster layout of CITUS_TEST=1 (see database.ts).
  const citus = process.env.CITUS_TEST === '1' ? { citus: true } : {};
  return kind === 'partitioned' ? { partitioned: true, ...citus } : citus;
}

/** A claim of `key` by a new attempt (a fresh owner token) in tenant `tenant-a`, for the store-level specs. */
export function claimRequest(key: string, over: Partial<ClaimRequest> = {}): ClaimRequest {
  return { tenant: 'tenant-a', key, ownerToken: randomUUID(), fingerprint: 'fp', leaseMs: 30_000, ttlMs: 3_600_000, ...over };
}
