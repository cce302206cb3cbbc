/** The effect ledger (`EffectLedger`). */
export const ledgerMessages = {
  noTransaction:
    'EffectLedger.once() needs a transaction: call it inside an @Idempotent() handler or IdempotencyService.execute() ' +
    '(it joins their transaction), or pass the EntityManager of a transaction of your own. A ledger row that commits ' +
    'apart from its effect proves nothing.',
  tenant:
    'EffectLedger: no tenant. Inside an idempotent execution the ledger uses its tenant; elsewhere pass { tenant }. ' +
    'There is no shared fallback scope.',
  key: (value: unknown) =>
    `EffectLedger: the business key must be a non-empty string such as 'order:1042:capture' (businessKey() builds one), got ${
      JSON.stringify(value) ?? String(value)
    }.`,
  scope: (value: unknown) => `EffectLedger: \`scope\` must be a non-empty string, got ${JSON.stringify(value) ?? String(value)}.`,
} as const;
