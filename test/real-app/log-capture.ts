import { inspect } from 'node:util';
import type { LoggerService } from '@nestjs/common';
import type { Logger as TypeOrmLogger } from 'typeorm';

/**
 * Renders a logged value the way a careless production logger would: SQL
 * parameters inline, a bytea parameter as its text, errors with every field.
 * The point is to see whatever a log line could reveal.
 */
function render(value: unknown): string {
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  if (typeof value === 'string') return value;
  if (Array.isArray(value)) return `[${value.map(render).join(', ')}]`;
  return inspect(value, { depth: 8, breakLength: Infinity });
}

/** TypeORM's logger with `logging: 'all'`: every statement with its parameters, every error. */
export class CapturingTypeOrmLogger implements TypeOrmLogger {
  readonly lines: string[] = [];

  logQuery(query: string, parameters?: unknown[]): void {
    this.lines.push(`query: ${query} -- parameters: ${render(parameters ?? [])}`);
  }
  logQueryError(error: string | Error, query: string, parameters?: unknown[]): void {
    this.lines.push(`query failed: ${query} -- parameters: ${render(parameters ?? [])} -- error: ${render(error)}`);
  }
  logQuerySlow(time: number, query: string, parameters?: unknown[]): void {
    this.lines.push(`slow query (${time} ms): ${query} -- parameters: ${render(parameters ?? [])}`);
  }
  logSchemaBuild(message: string): void {
    this.lines.push(`schema: ${message}`);
  }
  logMigration(message: string): void {
    this.lines.push(`migration: ${message}`);
  }
  log(level: string, message: unknown): void {
    this.lines.push(`${level}: ${render(message)}`);
  }
}

/** Nest's application logger, every level, with the optional context and stack arguments. */
export class CapturingNestLogger implements LoggerService {
  readonly lines: string[] = [];

  private push(level: string, message: unknown, params: unknown[]): void {
    this.lines.push(`${level}: ${[message, ...params].map(render).join(' ')}`);
  }
  log(message: unknown, ...params: unknown[]): void {
    this.push('log', message, params);
  }
  error(message: unknown, ...params: unknown[]): void {
    this.push('error', message, params);
  }
  warn(message: unknown, ...params: unknown[]): void {
    this.push('warn', message, params);
  }
  debug(message: unknown, ...params: unknown[]): void {
    this.push('debug', message, params);
  }
  verbose(message: unknown, ...params: unknown[]): void {
    this.push('verbose', message, params);
  }
  fatal(message: unknown, ...params: unknown[]): void {
    this.push('fatal', message, params);
  }
}
