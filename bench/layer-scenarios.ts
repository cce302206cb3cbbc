import type pg from 'pg';
import { AppProcess } from './app-process.js';
import type { AdapterName, BenchConfig } from './config.js';
import { BackendCpu, truncateAll } from './database.js';
import { LAYER_VARIANTS, measureVariants, type LayerVariantName, type VariantResult } from './http-scenarios.js';
import { APP_APPLICATION_NAME } from './protocol.js';

export interface LayerAdapterResults {
  adapter: AdapterName;
  poolMax: number;
  variants: Record<LayerVariantName, VariantResult>;
}

/**
 * Scenario 15 (issue 29): the charge written through the app's own Prisma client and its own Drizzle database, each
 * without and with `@Idempotent()`, interleaved in one app process per adapter, so each layer's module route is read
 * against its own bare handler.
 */
export async function runLayerScenarios(
  config: BenchConfig,
  databaseUrl: string,
  db: pg.Client,
  log: (line: string) => void,
): Promise<Partial<Record<AdapterName, LayerAdapterResults>>> {
  const results: Partial<Record<AdapterName, LayerAdapterResults>> = {};
  for (const adapter of config.adapters) {
    await truncateAll(db);
    const app = await AppProcess.start({ adapter, databaseUrl, schema: config.schema, poolSize: config.poolSize });
    try {
      const cpu = new BackendCpu(db, APP_APPLICATION_NAME);
      const variants = await measureVariants(app, LAYER_VARIANTS, config, { cpu }, log);
      results[adapter] = { adapter, poolMax: app.poolMax, variants };
    } finally {
      await app.close();
    }
  }
  return results;
}
