import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import type { SourceDataSource } from './connection.js';
import { IdempotencyConfigurationError } from '../errors/configuration.error.js';
import { messages } from '../errors/messages.js';
import type { RequiredTable } from './required-table.js';
import {
  DEFAULT_OUTBOX_TABLE_NAME,
  DEFAULT_TABLE_NAME,
  IDEMPOTENCY_DATA_SOURCE,
  IDEMPOTENCY_OPTIONS,
} from '../idempotency.constants.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.options.js';
import { IdempotencyStore } from '../core/idempotency-store.js';
import { PostgresIdempotencyStore } from './postgres/postgres-idempotency.store.js';
import { KEY_FUNCTIONS_VERSION } from './key-function-parts.sql.js';
import { keyStoreFunctionNames } from './key-function-names.js';
import { keyStoreFunctions } from './key-store.sql.js';
import { quoteTableName } from './identifiers.js';
import {
  KEY_TABLE_COLUMNS,
  KEY_TABLE_COLUMNS_ADDED_BY_UPGRADE,
  keyTableFillfactor,
  OUTBOX_TABLE_COLUMNS,
  plainRetentionIndexes,
} from './sql.js';
import { PARTITIONED_CLAIM_MARKER, partitionedRetentionIndexes } from './partitioned/partitioned-key-table.sql.js';
import { ledgerTable } from '../ledger/effect-ledger.js';
import { citusLayoutProblems } from './citus/citus-layout-check.js';

/**
 * Looks the table up as the store's SQL names it (quoted, so case is kept; an
 * unqualified name resolves through `search_path`), and lists its live columns.
 */
const INSPECT_SQL = `SELECT to_regclass($1) IS NOT NULL AS found,
  array_to_string(current_schemas(false), ', ') AS searched,
  ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped) AS columns`;

/**
 * Checks that each table exists with every column listed, on the data
 * source's own connections (so with its `search_path`).
 *
 * @returns one message per table that is missing or lacks columns, saying which migration creates it
 */
export async function findSchemaProblems(dataSource: SourceDataSource, tables: readonly RequiredTable[]): Promise<string[]> {
  const problems: string[] = [];
  for (const table of tables) {
    const [row] = (await dataSource.query(INSPECT_SQL, [quoteTableName(table.name)])) as Array<{
      found: boolean;
      searched: string;
      columns: string[];
    }>;
    const searched = table.name.includes('.') ? `schema "${table.name.split('.')[0]}"` : `search_path "${row.searched}"`;
    if (!row.found) {
      problems.push(messages.config.tableMissing(table, searched));
      continue;
    }
    const present = new Set(row.columns);
    const missing = table.columns.filter((column) => !present.has(column));
    const upgrade = table.addedByUpgrade;
    if (missing.length > 0 && upgrade && missing.every((column) => upgrade.includes(column))) {
      problems.push(messages.config.keyTableFromOlderVersion(table, `no column ${missing.join(', ')}`));
    } else if (missing.length > 0) {
      problems.push(messages.config.tableColumnsMissing(table, missing));
    }
  }
  return problems;
}

/**
 * The key table under `tableName`, as the module's migration and entity create it (the partitioned one has no entity).
 * sql/idempotency-keys.sql makes only the plain table under the default name, with the one-server functions.
 */
export function keyTable(tableName: string, partitioned = false, citus = false): RequiredTable {
  const isDefault = tableName === DEFAULT_TABLE_NAME;
  if (partitioned) {
    return {
      what: 'key',
      name: tableName,
      columns: KEY_TABLE_COLUMNS,
      addedByUpgrade: KEY_TABLE_COLUMNS_ADDED_BY_UPGRADE,
      migration: isDefault
        ? 'CreatePartitionedIdempotencyKeys1765152000000'
        : `createPartitionedIdempotencyKeysMigration({ tableName: '${tableName}' })`,
    };
  }
  return {
    what: 'key',
    name: tableName,
    columns: KEY_TABLE_COLUMNS,
    addedByUpgrade: KEY_TABLE_COLUMNS_ADDED_BY_UPGRADE,
    migration: isDefault ? 'CreateIdempotencyKeys1764460800000' : `createIdempotencyKeysMigration('${tableName}')`,
    entity: isDefault ? 'IdempotencyKeyEntity' : `createIdempotencyKeyEntity('${tableName}')`,
    sqlFile: isDefault && !citus ? 'sql/idempotency-keys.sql' : undefined,
  };
}

/** The outbox table under `tableName`, as the module's outbox migration creates it. */
export function outboxTable(tableName: string): RequiredTable {
  return {
    what: 'outbox',
    name: tableName,
    columns: OUTBOX_TABLE_COLUMNS,
    migration:
      tableName === DEFAULT_OUTBOX_TABLE_NAME ? 'CreateOutboxMessages1764547200000' : `createOutboxMigration('${tableName}')`,
  };
}

/**
 * Stops the app at start-up when a table the module needs is missing or lacks
 * columns, with a message naming the migration to run, instead of a 500 on
 * the first request. Runs in `onModuleInit`: after the data source is
 * initialised (with `migrationsRun`, or `migratingDataSourceFactory`, its
 * migrations have run by then) and before any `onApplicationBootstrap` starts
 * the sweeper or the relay. The key table is checked only for the module's
 * own `PostgresIdempotencyStore` (a store you bring keeps its data elsewhere);
 * the outbox table only when the `outbox` option is given.
 */
@Injectable()
export class IdempotencySchemaCheck implements OnModuleInit {
  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: SourceDataSource,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly store: IdempotencyStore,
  ) {}

  async onModuleInit(): Promise<void> {
    // With `manualInitialization` the app connects later, itself; there is nothing to look at yet.
    if (!this.dataSource.isInitialized) return;
    const tables: RequiredTable[] = [];
    const keys =
      this.store instanceof PostgresIdempotencyStore
        ? keyTable(this.store.tableName, this.store.partitioned, this.options.citus)
        : undefined;
    if (keys) tables.push(keys);
    if (this.options.outbox.configured) tables.push(outboxTable(this.options.outbox.tableName));
    if (this.options.ledger.configured) tables.push(ledgerTable(this.options.ledger.tableName));
    const problems = await findSchemaProblems(this.dataSource, tables);
    if (problems.length === 0 && keys && this.store instanceof PostgresIdempotencyStore) {
      problems.push(...(await this.checkLayout(keys, this.store.partitioned)));
      if (problems.length === 0) problems.push(...(await retentionIndexProblems(this.dataSource, keys, this.store.partitioned)));
      if (problems.length === 0) problems.push(...(await this.checkFunctions(keys, this.store.partitioned)));
      if (problems.length === 0 && this.dataSource.options.synchronize && !this.store.partitioned) {
        // The entity cannot say it: the room on each page that lets the completion be a HOT update. A no-op once set.
        await this.dataSource.query(keyTableFillfactor(quoteTableName(keys.name)));
      }
      // Only with `citus: true`: one server's start-up sends what it always did.
      if (problems.length === 0 && this.options.citus) problems.push(...(await this.checkCitusLayout(keys)));
    }
    if (problems.length > 0) throw new IdempotencyConfigurationError(problems.join('\n'));
  }

  private checkLayout(table: RequiredTable, partitioned: boolean): Promise<string[]> {
    return layoutProblems(this.dataSource, table, partitioned);
  }

  /**
   * The distributed layout `citus: true` needs: every table of the module distributed by tenant and co-located, the
   * key functions delegated with their Citus texts. A half-distributed layout would let requests span workers, or
   * take a key's lock on a node that does not hold its row.
   */
  private checkCitusLayout(table: RequiredTable): Promise<string[]> {
    return citusLayoutProblems((sql, params) => this.dataSource.query(sql, params) as Promise<unknown[]>, {
      tableName: table.name,
      outboxTableName: this.options.outbox.configured ? this.options.outbox.tableName : undefined,
      ledgerTableName: this.options.ledger.configured ? this.options.ledger.tableName : undefined,
    });
  }

  /**
   * The claim and completion functions. With `synchronize: true` TypeORM
   * made the table from the entity and knows nothing of functions, so the
   * module creates them itself (idempotent, under the migration's lock);
   * otherwise a missing one names the migration.
   */
  private async checkFunctions(table: RequiredTable, partitioned: boolean): Promise<string[]> {
    const missing = await missingFunctions(this.dataSource, table.name);
    if (missing.length === 0) {
      if (partitioned && !(await hasPartitionedClaim(this.dataSource, table.name))) {
        return [messages.config.partitionedFunctionsStale(table)];
      }
      const stale = await staleClaimFunctions(this.dataSource, table.name, partitioned);
      if (stale.length === 0) return [];
      if (!this.dataSource.options.synchronize || partitioned || this.options.citus) {
        return [messages.config.functionsFromOlderVersion(table, stale, KEY_FUNCTIONS_VERSION)];
      }
    } else if (!this.dataSource.options.synchronize || partitioned || this.options.citus) {
      return [messages.config.functionsMissing(table, missing)];
    }
    await this.dataSource.transaction(async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`nest-idempotency:migrate:${table.name}`]);
      for (const statement of keyStoreFunctions(table.name)) await tx.query(statement);
    });
    return [];
  }
}

/**
 * Whether the key table is partitioned as the options say: the partitioned
 * table needs its partitions retired (and a plain table's claim function would
 * fail on it), the plain one its rows swept.
 */
async function layoutProblems(dataSource: SourceDataSource, table: RequiredTable, partitioned: boolean): Promise<string[]> {
  const [row] = (await dataSource.query(`SELECT relkind = 'p' AS partitioned FROM pg_class WHERE oid = to_regclass($1)`, [
    quoteTableName(table.name),
  ])) as Array<{ partitioned: boolean }>;
  return row && row.partitioned !== partitioned ? [messages.config.layoutMismatch(table, partitioned)] : [];
}

/**
 * Whether the key table has this version's retention index, and not the one
 * earlier versions had in its place (an index on columns the completion
 * changes, so that no completion could be a HOT update): both mean the table
 * was not upgraded. Other indexes, the app's own, are the app's business.
 */
async function retentionIndexProblems(
  dataSource: SourceDataSource,
  table: RequiredTable,
  partitioned: boolean,
): Promise<string[]> {
  const { current, earlier } = partitioned ? partitionedRetentionIndexes(table.name) : plainRetentionIndexes(table.name);
  const [row] = (await dataSource.query(
    `SELECT ARRAY(SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                   WHERE i.indrelid = to_regclass($1)) AS indexes`,
    [quoteTableName(table.name)],
  )) as Array<{ indexes: string[] }>;
  const found: string[] = [];
  if (!row.indexes.includes(current)) found.push(`no index ${current}`);
  if (row.indexes.includes(earlier)) found.push(`the index ${earlier}`);
  return found.length > 0 ? [messages.config.keyTableFromOlderVersion(table, found.join(', '))] : [];
}

/** Whether the claim function is the partitioned table's (its marker comment), not one a plain table's migration put there. */
async function hasPartitionedClaim(dataSource: SourceDataSource, tableName: string): Promise<boolean> {
  const [claim] = keyStoreFunctionNames(tableName);
  const [row] = (await dataSource.query('SELECT position($2 IN prosrc) > 0 AS marked FROM pg_proc WHERE oid = to_regproc($1)', [
    claim,
    PARTITIONED_CLAIM_MARKER,
  ])) as Array<{ marked: boolean }>;
  return row?.marked === true;
}

/** The claim functions (the plain table's two, the partitioned table's one) that an older version created. */
async function staleClaimFunctions(dataSource: SourceDataSource, tableName: string, partitioned: boolean): Promise<string[]> {
  const [claim, , , claimInTransaction] = keyStoreFunctionNames(tableName);
  const names = partitioned ? [claim] : [claim, claimInTransaction];
  const [row] = (await dataSource.query(
    'SELECT ARRAY(SELECT n FROM unnest($1::text[]) n JOIN pg_proc p ON p.oid = to_regproc(n) WHERE position($2 IN p.prosrc) = 0) AS stale',
    [names, KEY_FUNCTIONS_VERSION],
  )) as Array<{ stale: string[] }>;
  return row.stale;
}

/** Which of the key table's functions (`keyStoreFunctions`) do not exist, as the store names them. */
async function missingFunctions(dataSource: SourceDataSource, tableName: string): Promise<string[]> {
  const names = keyStoreFunctionNames(tableName);
  const [row] = (await dataSource.query(
    'SELECT ARRAY(SELECT n FROM unnest($1::text[]) n WHERE to_regproc(n) IS NULL) AS missing',
    [names],
  )) as Array<{ missing: string[] }>;
  return row.missing;
}
