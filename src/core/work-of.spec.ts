import { describe, expect, it } from '@jest/globals';
import { WORK_SCOPE_FIELDS, workOf, type WorkScope } from './idempotency-engine.js';

describe('workOf', () => {
  it('copies every field of the scope (the compiler keeps WORK_SCOPE_FIELDS complete) and adds the run', () => {
    // A distinct value in every field, so a field copied into another's place shows too.
    const scope = Object.fromEntries(
      Object.keys(WORK_SCOPE_FIELDS).map((field) => [field, `value of ${field}`]),
    ) as unknown as WorkScope;
    const run = () => undefined;
    const work = workOf(scope, run);
    expect(work).toEqual({ ...scope, run });
    expect(Object.keys(work).sort()).toEqual([...Object.keys(WORK_SCOPE_FIELDS), 'run'].sort());
  });
});
