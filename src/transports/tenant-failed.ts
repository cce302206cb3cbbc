import { HttpException, type Logger } from '@nestjs/common';
import { messages } from '../errors/messages.js';
import { problems } from '../errors/problems.js';

/** The tenant resolver threw: its `HttpException` (a 401) goes out as it is; anything else is logged and fails closed. */
export function tenantFailed(logger: Logger, error: unknown, routeName: string): HttpException {
  if (error instanceof HttpException) return error;
  logger.error(messages.log.tenantFailed(routeName), error instanceof Error ? error.stack : String(error));
  return problems.tenantUnresolved();
}

/** A resolver's promised tenant, checked by `check`; a rejection fails as `tenantFailed` says. */
export function tenantLater(
  tenant: PromiseLike<unknown>,
  logger: Logger,
  routeName: string,
  check: (tenant: unknown) => string,
): Promise<string> {
  return Promise.resolve(tenant).then(check, (error: unknown) => {
    throw tenantFailed(logger, error, routeName);
  });
}

/** The resolver's tenant is none (`unusable` says why): logged, and the request fails closed. */
export function tenantRefused(logger: Logger, routeName: string, tenant: unknown, unusable: string): HttpException {
  logger.error(
    tenant === undefined || tenant === null
      ? messages.log.tenantUnresolved(routeName)
      : messages.log.tenantUnusable(routeName, unusable),
  );
  return problems.tenantUnresolved();
}
