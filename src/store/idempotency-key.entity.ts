import type { DataSource, EntitySchema, EntitySchemaOptions } from 'typeorm';
import type { SourceDataSource } from './connection.js';
import { DEFAULT_TABLE_NAME } from '../idempotency.constants.js';

/** A row of the key table, for reading it with TypeORM (the module itself uses plain SQL). */
export interface IdempotencyKeyRecord {
  tenantId: string;
  key: string;
  fingerprint: string;
  status: 'in_flight' | 'completed';
  ownerToken: string;
  /** Names one use of the key: kept by takeovers, new once it expired (derived downstream keys hang off it). */
  generation: string | null;
  attempt: number;
  leaseExpiresAt: Date;
  expiresAt: Date;
  createdAt: Date;
  completedAt: Date | null;
  responseStatus: number | null;
  responseHeaders: Array<[string, string]> | null;
  responseBody: Buffer | null;
  recoveryPoint: string | null;
  phaseResults: string | null;
  /** No earlier than this the record expires: the claim's expiry, which its completion leaves alone (the sweeper's index). */
  expiryFloor: Date;
}

/**
 * The key table as a TypeORM entity schema, for the `synchronize: true`
 * quick start (`entities: [IdempotencyKeyEntity]`). Production apps should
 * use `createIdempotencyKeysMigration()` instead.
 */
export function createIdempotencyKeyEntity(tableName: string = DEFAULT_TABLE_NAME): EntitySchema<IdempotencyKeyRecord> {
  const bare = tableName.split('.').pop() ?? tableName;
  const schema = tableName.includes('.') ? tableName.slice(0, tableName.lastIndexOf('.')) : undefined;
  return entitySchema<IdempotencyKeyRecord>({
    name: `IdempotencyKey:${tableName}`,
    tableName: bare,
    schema,
    columns: {
      tenantId: { name: 'tenant_id', type: 'text', primary: true },
      key: { name: 'key', type: 'text', primary: true },
      fingerprint: { type: 'text' },
      status: { type: 'text' },
      ownerToken: { name: 'owner_token', type: 'uuid' },
      generation: { type: 'uuid', nullable: true },
      attempt: { type: 'integer', default: 1 },
      leaseExpiresAt: { name: 'lease_expires_at', type: 'timestamptz' },
      expiresAt: { name: 'expires_at', type: 'timestamptz' },
      createdAt: { name: 'created_at', type: 'timestamptz', default: () => 'now()' },
      completedAt: { name: 'completed_at', type: 'timestamptz', nullable: true },
      responseStatus: { name: 'response_status', type: 'integer', nullable: true },
      responseHeaders: { name: 'response_headers', type: 'jsonb', nullable: true },
      responseBody: { name: 'response_body', type: 'bytea', nullable: true },
      recoveryPoint: { name: 'recovery_point', type: 'text', nullable: true },
      phaseResults: { name: 'phase_results', type: 'text', nullable: true },
      // The module always writes it; the default lets `synchronize` add the column to a table with rows in it,
      // which the sweeper then finds from its first run and deletes as their expires_at passes.
      expiryFloor: { name: 'expiry_floor', type: 'timestamptz', default: () => "'-infinity'" },
    },
    checks: [{ expression: `"status" IN ('in_flight', 'completed')` }],
    indices: [{ name: `${bare}_expiry_floor_idx`, columns: ['expiryFloor'] }],
  });
}

export const IdempotencyKeyEntity = createIdempotencyKeyEntity();

/**
 * An entity schema as TypeORM's `new EntitySchema(options)` makes it: its
 * options and the marker TypeORM recognises entity schemas by
 * (`InstanceChecker.isEntitySchema`). Built here so that the package's entry
 * point loads without typeorm, for apps on a plain pg pool.
 */
function entitySchema<T>(options: EntitySchemaOptions<T>): EntitySchema<T> {
  return { options, '@instanceof': Symbol.for('EntitySchema') } as unknown as EntitySchema<T>;
}

/**
 * The key table the store uses. An app that registered the key entity
 * (`entities: [IdempotencyKeyEntity]`, or `TypeOrmModule.forFeature`) gets
 * the table TypeORM manages for it, schema included (TypeORM gives entities
 * without a schema the data source's `schema`), so the module and the app's
 * tooling see one table. Otherwise (and on a plain pg pool, which has no
 * entities) the configured name, resolved through `search_path` when unqualified.
 */
export function keyTableOf(dataSource: SourceDataSource, tableName: string): string {
  const entities = (dataSource as Partial<Pick<DataSource, 'entityMetadatas'>>).entityMetadatas;
  if (!dataSource.isInitialized || !entities) return tableName;
  const metadata = entities.find((m) => m.name === `IdempotencyKey:${tableName}`);
  return metadata ? metadata.tablePath : tableName;
}
