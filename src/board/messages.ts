/** The operator board; no message names a key, a tenant or a body. */
export const boardMessages = {
  noGuard:
    'IdempotencyBoardModule.forRoot() needs a guard: the board shows keys and outcomes and can release keys and ' +
    'redrive messages. Pass { guard: YourAdminGuard } (a class or an instance), or { unguarded: true } for a local tool.',
  unguarded: (path: string) =>
    `The idempotency board at /${path} runs without a guard (unguarded: true): anyone who reaches it can see keys and ` +
    'release them.',
  badPath: 'IdempotencyBoardModule.forRoot({ path }): give the path the board is mounted at, e.g. "board".',
  noPostgresStore:
    'The idempotency board reads the key table of PostgresIdempotencyStore; with a store of your own it cannot run. ' +
    'Leave it out of the imports.',
  badScope: "The board's scope function gave neither { tenant } nor { allTenants: true } for this operator, so nothing is shown.",
  csrf:
    "This action needs the board's anti-forgery token: reload the board page and try again (requests from other " +
    'sites are refused).',
  badRequest: (what: string) => `The request's ${what} is missing or malformed.`,
  notFound: 'No such key for this tenant, or it is not yours to see.',
  released: 'That attempt no longer holds the key: it finished, was taken over, or was released already. Refresh.',
  timedOut: (ms: number) =>
    `The key table did not answer within ${ms} ms (counting a very large table is a full scan). Try again later, or ` +
    'look up single keys.',
} as const;
