import { Controller, Get } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { IdempotencyHealthIndicator } from '../../src/health/index.js';
import { Public } from '../auth/public.decorator.js';

/**
 * 200 while the database answers `SELECT 1` and the idempotency store answers a
 * claim, each within a second; 503 otherwise. A sweeper falling behind or dead
 * outbox messages show as `degraded`, still 200.
 */
@Controller('health')
@Public()
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly database: TypeOrmHealthIndicator,
    private readonly idempotency: IdempotencyHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([
      () => this.database.pingCheck('database').withTimeout(1_000),
      () => this.idempotency.isHealthy('idempotency', { timeout: 1_000 }),
    ]);
  }
}
