export { IdempotencyBoardModule } from './board.module.js';
export type { BoardScope, IdempotencyBoardOptions } from './board.options.js';
export { BoardProblemType } from './board-problems.js';
export { BOARD_CSRF_COOKIE, BOARD_CSRF_HEADER } from './board-csrf.js';
