import { Catch, HttpStatus, type ArgumentsHost, type ExceptionFilter } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { boardMessages } from './messages.js';
import { IdempotencyProblemException, PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE } from '../errors/problems.js';

/** The board's own problem types (RFC 9457), beside the module's. */
export const BoardProblemType = {
  forbidden: `${PROBLEM_TYPE_BASE}board-forbidden`,
  csrf: `${PROBLEM_TYPE_BASE}board-csrf`,
  badRequest: `${PROBLEM_TYPE_BASE}board-bad-request`,
  notFound: `${PROBLEM_TYPE_BASE}board-not-found`,
  gone: `${PROBLEM_TYPE_BASE}board-attempt-gone`,
} as const;

const problem = (type: string, title: string, status: number, detail: string) =>
  new IdempotencyProblemException({ type, title, status, detail });

export const boardProblems = {
  badScope: () => problem(BoardProblemType.forbidden, 'Forbidden', HttpStatus.FORBIDDEN, boardMessages.badScope),
  csrf: () => problem(BoardProblemType.csrf, 'Forbidden', HttpStatus.FORBIDDEN, boardMessages.csrf),
  badRequest: (what: string) =>
    problem(BoardProblemType.badRequest, 'Bad request', HttpStatus.BAD_REQUEST, boardMessages.badRequest(what)),
  notFound: () => problem(BoardProblemType.notFound, 'Not found', HttpStatus.NOT_FOUND, boardMessages.notFound),
  released: () => problem(BoardProblemType.gone, 'Attempt gone', HttpStatus.CONFLICT, boardMessages.released),
};

/**
 * Sends the board's problems as `application/problem+json` through the HTTP
 * adapter, whatever exception filter the app has: the board's page reads
 * their `detail`. Other errors (the app guard's 401, say) go on to the app's
 * own filters.
 */
@Catch(IdempotencyProblemException)
export class BoardProblemFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: IdempotencyProblemException, host: ArgumentsHost): void {
    const adapter = this.adapterHost.httpAdapter;
    const response = host.switchToHttp().getResponse<unknown>();
    adapter.setHeader(response, 'Content-Type', PROBLEM_CONTENT_TYPE);
    adapter.setHeader(response, 'Cache-Control', 'no-store');
    adapter.reply(response, JSON.stringify(exception.problem), exception.problem.status);
  }
}
