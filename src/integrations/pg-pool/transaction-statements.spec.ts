import { describe, expect, it } from '@jest/globals';
import { statementsOf, transactionStatementOf } from './transaction-statements.js';

describe('transactionStatementOf', () => {
  it.each([
    ['BEGIN', { kind: 'begin', otherModes: false }],
    ['start transaction;', { kind: 'begin', otherModes: false }],
    ['BEGIN ISOLATION LEVEL REPEATABLE READ', { kind: 'begin', isolation: 'repeatable read', otherModes: false }],
    ['BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY', { kind: 'begin', isolation: 'serializable', otherModes: true }],
    ['BEGIN READ ONLY', { kind: 'begin', otherModes: true }],
    ['/* prisma */ COMMIT', { kind: 'commit' }],
    ['-- a note\nend transaction', { kind: 'commit' }],
    ['ROLLBACK', { kind: 'rollback' }],
    ['abort work', { kind: 'rollback' }],
    ['SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED', { kind: 'set-isolation', isolation: 'read committed' }],
    ['SET TRANSACTION READ ONLY', { kind: 'other-control' }],
    ['COMMIT AND CHAIN', { kind: 'other-control' }],
    ["PREPARE TRANSACTION 'x'", { kind: 'other-control' }],
    ['INSERT INTO t VALUES (1); COMMIT', { kind: 'other-control' }],
    ['commit; begin', { kind: 'other-control' }],
  ])('%j is %j', (text, expected) => {
    expect(transactionStatementOf(text)).toEqual(expected);
  });

  it.each([
    'INSERT INTO t (note) VALUES ($1)',
    "INSERT INTO t (note) VALUES ('done; commit')",
    "INSERT INTO t (note) VALUES (E'it\\'s; rollback')",
    'SELECT 1 AS "x; commit"',
    'SELECT $$; commit$$',
    'SELECT $tag$; end $tag$',
    'SELECT 1 -- ; commit',
    'SELECT 1 /* ; commit */',
    'ROLLBACK TO SAVEPOINT a',
    'SAVEPOINT a',
    'RELEASE SAVEPOINT a',
    'SELECT 1; SELECT 2',
  ])('%j is none', (text) => {
    expect(transactionStatementOf(text)).toBeUndefined();
  });

  it('splits at semicolons outside literals and comments only', () => {
    expect(statementsOf("SELECT 'a;b'; SELECT 2 -- c;d\n;")).toEqual(["SELECT 'a;b'", 'SELECT 2']);
  });
});
