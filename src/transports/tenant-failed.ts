import { HttpException, type Logger } from '@nestjs/common';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';

/** The tenant resolver threw: its `HttpException` (a 401) goes out as it is; anything else is logged and fails closed. */
export function tenantFailed(logger: Logger, error: unknown, routeName: string): unknown {
  if (error instanceof HttpException) return error;
  logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
  return problems.tenantUnresolved();
}
