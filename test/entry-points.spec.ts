import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { importGraph, packageOf, ROOT } from './support/import-graph.js';

interface Manifest {
  name: string;
  dependencies: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
  exports: Record<string, string | Record<string, string>>;
}

const manifest = JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')) as Manifest;
const optionalPeers = Object.keys(manifest.peerDependencies).filter((name) => manifest.peerDependenciesMeta[name]?.optional);
/** What every app installs: the package's dependencies and its required peers. */
const required = new Set([
  ...Object.keys(manifest.dependencies),
  ...Object.keys(manifest.peerDependencies).filter((name) => !optionalPeers.includes(name)),
]);

/** The packages a graph names beyond Node's built-ins and what every app installs. */
const beyondRequired = (packages: Map<string, string[]>) =>
  [...new Set([...packages.keys()].filter((s) => !s.startsWith('node:')).map(packageOf))].filter((name) => !required.has(name));

/**
 * Each subpath, its source, and the optional peers it may import statically
 * (the JetStream transport extends `@nestjs/microservices`' `Server`); every
 * other optional peer is imported only when a feature is used.
 */
const SUBPATHS: Array<[subpath: string, source: string, staticPeers: string[]]> = [
  ['./client', 'src/client/index.ts', []],
  ['./jetstream', 'src/rpc/jetstream/index.ts', ['@nestjs/microservices', '@nats-io/jetstream', '@nats-io/transport-node']],
  ['./health', 'src/health/index.ts', []],
  ['./openapi', 'src/openapi/index.ts', []],
  ['./graphql', 'src/graphql/index.ts', []],
  ['./outbound', 'src/outbound/index.ts', []],
  ['./board', 'src/board/index.ts', []],
  // Provided by IdempotencyModule to every app, named only here: an app that does not use them imports none of their names.
  ['./outbox', 'src/outbox/index.ts', []],
  ['./ledger', 'src/ledger/index.ts', []],
  // The store contract, for a store of one's own.
  ['./store', 'src/store/index.ts', []],
  // The app's own transaction managers: their packages are loaded at start-up, only when one is the module's transactionManager.
  ['./cls-transactional', 'src/integrations/cls-transactional/index.ts', []],
  ['./typeorm-transactional', 'src/integrations/typeorm-transactional/index.ts', []],
  // Drizzle's types only (its database in DrizzleTransactionHost#db); drizzle-orm itself is loaded at start-up.
  ['./drizzle', 'src/integrations/drizzle/index.ts', ['drizzle-orm']],
  // A pg pool for ORMs on the app's own pool (Prisma's @prisma/adapter-pg): pg only, a required peer.
  ['./pg-pool', 'src/integrations/pg-pool/index.ts', []],
];

describe('the root entry (nest-idempotency-pg)', () => {
  it('reaches nothing but Node built-ins, its dependencies and the required peers, at run time or in its types', () => {
    const { files, packages } = importGraph('src/index.ts', true);
    expect(files.length).toBeGreaterThan(30);
    expect(beyondRequired(packages)).toEqual([]);
    // The required peers are the core's: Nest, TypeORM and pg's driver through it, rxjs.
    expect([...required].sort()).toEqual(
      [
        '@nestjs/common',
        '@nestjs/core',
        '@nestjs/typeorm',
        'ms',
        'pg',
        'reflect-metadata',
        'rxjs',
        'structured-headers',
        'typeorm',
      ].sort(),
    );
  });

  it('holds no integration that has a subpath: no health, OpenAPI or outbound code, and no subpath entry', () => {
    const { files } = importGraph('src/index.ts', true);
    expect(
      files.filter((file) => /^src\/(health|openapi|outbound|board|client|rpc\/jetstream|integrations)\//.test(file)),
    ).toEqual([]);
    // GraphQL mutations are an entry point of @Idempotent(), like HTTP routes: the transport and its errors, no package.
    expect(files.filter((file) => file.startsWith('src/graphql/')).sort()).toEqual(['src/graphql/graphql-problem.ts']);
  });

  it('exports no name a subpath exports: each name has one entry', async () => {
    const root = Object.keys(await import('../src/index.js'));
    expect(root.length).toBeGreaterThan(20);
    const subpaths = {
      health: Object.keys(await import('../src/health/index.js')),
      openapi: Object.keys(await import('../src/openapi/index.js')),
      graphql: Object.keys(await import('../src/graphql/index.js')),
      outbound: Object.keys(await import('../src/outbound/index.js')),
      board: Object.keys(await import('../src/board/index.js')),
      outbox: Object.keys(await import('../src/outbox/index.js')),
      ledger: Object.keys(await import('../src/ledger/index.js')),
      store: Object.keys(await import('../src/store/index.js')),
      clsTransactional: Object.keys(await import('../src/integrations/cls-transactional/index.js')),
      typeormTransactional: Object.keys(await import('../src/integrations/typeorm-transactional/index.js')),
      drizzle: Object.keys(await import('../src/integrations/drizzle/index.js')),
      pgPool: Object.keys(await import('../src/integrations/pg-pool/index.js')),
    };
    for (const [subpath, names] of Object.entries(subpaths)) {
      expect({ subpath, shared: names.filter((name) => root.includes(name)) }).toEqual({ subpath, shared: [] });
    }
    expect(subpaths).toEqual({
      health: expect.arrayContaining(['IdempotencyHealthModule', 'IdempotencyHealthIndicator', 'HEALTH_PROBE_TENANT']),
      openapi: expect.arrayContaining(['IdempotencyOpenApiModule', 'applyIdempotencyToOpenApi', 'IDEMPOTENCY_PROBLEM_SCHEMA']),
      graphql: ['IdempotencyGraphQLError'],
      outbound: expect.arrayContaining([
        'IdempotentHttpModule',
        'createDownstreamFetch',
        'attachDownstreamKeys',
        'downstreamPurpose',
      ]),
      board: expect.arrayContaining(['IdempotencyBoardModule', 'BoardProblemType']),
      outbox: expect.arrayContaining(['Outbox', 'OutboxRelay', 'createOutboxMigration', 'CreateOutboxMessages1764547200000']),
      ledger: expect.arrayContaining([
        'EffectLedger',
        'EffectLedgerUsageError',
        'createEffectLedgerMigration',
        'CreateEffectLedger1764806400000',
      ]),
      store: ['IdempotencyStore', 'beginAttempt'],
      clsTransactional: ['clsTransactional'],
      typeormTransactional: ['typeormTransactional'],
      drizzle: ['DrizzleTransactionHost', 'IdempotencyDrizzleModule', 'clsTransactionalDrizzle'],
      pgPool: ['IdempotentPool', 'idempotentPool'],
    });
  });
});

describe('the subpaths', () => {
  it('are every entry of package.json exports (besides the root and package.json)', () => {
    const listed = Object.keys(manifest.exports).filter((subpath) => subpath !== '.' && subpath !== './package.json');
    expect(listed.sort()).toEqual(SUBPATHS.map(([subpath]) => subpath).sort());
  });

  it.each(SUBPATHS)('%s is exported with its types, from the build of %s', (subpath, source) => {
    // tsconfig.build.json compiles src/ into dist/ (rootDir src): src/x/index.ts lands at dist/x/index.js.
    const built = source.replace(/^src\//, './dist/').replace(/\.ts$/, '');
    expect(manifest.exports[subpath]).toEqual({ types: `${built}.d.ts`, import: `${built}.js`, default: `${built}.js` });
  });

  it.each(SUBPATHS)('%s imports no optional peer but its own transport when loaded', (_subpath, source, staticPeers) => {
    const { packages } = importGraph(source, true);
    expect(beyondRequired(packages).sort()).toEqual([...staticPeers].sort());
    for (const peer of staticPeers) expect({ peer, optional: optionalPeers.includes(peer) }).toEqual({ peer, optional: true });
  });

  it('declares the peers of every integration optional', () => {
    for (const name of [
      '@nestjs/terminus',
      '@nestjs/swagger',
      '@nestjs/graphql',
      '@nestjs/axios',
      'axios',
      '@nestjs/microservices',
      '@nestjs/schedule',
      '@opentelemetry/api',
      'nestjs-cls',
      '@nestjs-cls/transactional',
      'typeorm-transactional',
      'drizzle-orm',
      '@nestjs-cls/transactional-adapter-drizzle-orm',
      '@prisma/adapter-pg',
      '@prisma/client',
    ]) {
      expect({ name, peer: typeof manifest.peerDependencies[name], optional: optionalPeers.includes(name) }).toEqual({
        name,
        peer: 'string',
        optional: true,
      });
    }
  });
});
